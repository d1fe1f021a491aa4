"""A Postgres server of a test's own (initdb + pg_ctl on a free port, under
/tmp), for tests about the server's own limits: its `max_connections` is
Postgres's default (100, 3 of them kept for superusers) unless told, and no
other test's sessions count against it.

Run as root (CI), the server runs as the `postgres` system user, which
initdb requires. `app_url` connects as a login role that is not a superuser,
so the 3 reserved sessions are not the deployment's to use.
"""

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.tcpproxy import free_port

APP_ROLE = "wi_app"
APP_DATABASE = "webhooks"


@dataclass(frozen=True)
class PrivatePostgres:
    port: int
    data_dir: Path

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    @property
    def app_url(self) -> str:
        return f"postgresql://{APP_ROLE}@127.0.0.1:{self.port}/{APP_DATABASE}"

    def log(self) -> str:
        return (self.data_dir / "server.log").read_text(errors="replace")


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name) or name


def as_server_user(args: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


def _run(args: list[str]) -> None:
    subprocess.run(as_server_user(args), check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@contextlib.contextmanager
def running(**settings: str) -> Iterator[PrivatePostgres]:
    """The server, started with `settings` (postgresql.conf names) on top of
    initdb's; stopped and removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="wi-private-pg-"))
    data_dir = root / "data"
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
    port = free_port()
    try:
        _run([_bin("initdb"), "-D", str(data_dir), "-U", "postgres", "-A", "trust", "--no-sync"])
        options = {
            "port": str(port),
            "listen_addresses": "'127.0.0.1'",
            "unix_socket_directories": f"'{root}'",
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            **settings,
        }
        with open(data_dir / "postgresql.conf", "a") as conf:
            conf.writelines(f"{name} = {value}\n" for name, value in options.items())
        _run([_bin("pg_ctl"), "-D", str(data_dir), "-l", str(data_dir / "server.log"), "-w", "start"])
        try:
            _run(
                [
                    _bin("psql"),
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(port),
                    "-U",
                    "postgres",
                    "-q",
                    "-c",
                    f"CREATE ROLE {APP_ROLE} LOGIN",
                    "-c",
                    f"CREATE DATABASE {APP_DATABASE} OWNER {APP_ROLE}",
                ]
            )
            yield PrivatePostgres(port, data_dir)
        finally:
            _run([_bin("pg_ctl"), "-D", str(data_dir), "-m", "immediate", "-w", "stop"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
