"""A PgBouncer of a test's own (Debian's `pgbouncer`, on a free port) in
front of a private Postgres (tests/support/private_postgres.py), every
database passed through, every user trusted."""

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support.private_postgres import APP_DATABASE, APP_ROLE, PrivatePostgres, as_server_user
from tests.support.tcpproxy import free_port


@contextlib.contextmanager
def running(server: PrivatePostgres, pool_mode: str, pool_size: int = 20, more: str = "") -> Iterator[str]:
    """Yields the URL that reaches the server's app database through the pooler;
    `more`: further `[pgbouncer]` lines."""
    root = Path(tempfile.mkdtemp(prefix="wi-pgbouncer-"))
    port = free_port()
    (root / "users.txt").write_text(f'"{APP_ROLE}" ""\n')
    (root / "pgbouncer.ini").write_text(
        f"[databases]\n* = host=127.0.0.1 port={server.port}\n"
        f"[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {root}/users.txt\npool_mode = {pool_mode}\n"
        f"default_pool_size = {pool_size}\nmax_client_conn = 500\nlogfile = {root}/pgbouncer.log\n{more}"
    )
    if os.geteuid() == 0:
        for path in (root, *root.iterdir()):
            shutil.chown(path, "postgres")
    process = subprocess.Popen(
        as_server_user([shutil.which("pgbouncer") or "/usr/sbin/pgbouncer", str(root / "pgbouncer.ini")])
    )
    try:
        _until_listening(port, process)
        yield f"postgresql://{APP_ROLE}@127.0.0.1:{port}/{APP_DATABASE}"
    finally:
        process.terminate()
        process.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)


def _until_listening(port: int, process: subprocess.Popen, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"pgbouncer exited with {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            return
        time.sleep(0.05)
    raise RuntimeError(f"pgbouncer not listening on {port} after {timeout} s")
