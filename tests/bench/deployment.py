"""A throwaway deployment for one bench run: its own namespace, database,
sources file, ingress and worker processes; everything removed at the end.

The processes are the ones `webhook-ingest run` starts by default, with the
same arguments (`webhook_ingest.cli.layout`), so the bench measures what a new
user gets. BENCH_INGRESS_PROCESSES, BENCH_WORKERS and BENCH_CONCURRENCY
override the layout, only to compare candidates for the defaults."""

import asyncio
import contextlib
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import aio_pika
import asyncpg
import redis.asyncio as redis

from tests.bench.handler import EFFECTS_TABLE
from tests.support.broker import ctl_command
from tests.support.processes import Fleet, Process, wait_for_output
from tests.support.tcpproxy import free_port
from webhook_ingest.cli import layout
from webhook_ingest.cli.migrate import migrate
from webhook_ingest.shared.broker import topology

AMQP_URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
SERVER_URL = os.environ.get("BENCH_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
SOURCE, SECRET = "bench", "bench-secret"
INGRESS_PROCESSES = layout.ingress_processes(os.environ.get("BENCH_INGRESS_PROCESSES", "auto"))
WORKERS = int(os.environ.get("BENCH_WORKERS", layout.WORKERS))
CONCURRENCY = int(os.environ.get("BENCH_CONCURRENCY", layout.CONCURRENCY))


def source_entry(name: str, handler: str, **options: str) -> str:
    """A sources-file entry signed with SECRET, event ids from the body."""
    entry = (
        f'[sources.{name}]\nscheme = "hmac-sha256"\nsecrets = ["{SECRET}"]\n'
        f'handler = "{handler}"\nevent_id = ["body:id"]\n'
    )
    if options:
        entry += "handler_options = { " + ", ".join(f'{k} = "{v}"' for k, v in options.items()) + " }\n"
    return entry


BENCH_SOURCE = source_entry(SOURCE, "tests.bench.handler:record")


@contextlib.asynccontextmanager
async def scratch_database(prefix: str):
    """A connection to a new database of its own, migrated; dropped after."""
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    url = SERVER_URL.rsplit("/", 1)[0] + "/" + name
    try:
        await migrate(url)
        connection = await asyncpg.connect(url)
        try:
            yield connection
        finally:
            await connection.close()
    finally:
        admin = await asyncpg.connect(SERVER_URL)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


class Deployment:
    def __init__(self, amqp_url: str = AMQP_URL, sources: str = ""):
        run_id = uuid.uuid4().hex[:8]
        self.namespace = f"bench_{run_id}"
        self.database_url = SERVER_URL.rsplit("/", 1)[0] + f"/wi_bench_{run_id}"
        self.amqp_url = amqp_url
        self._dir = Path(tempfile.mkdtemp(prefix="wi-bench-"))
        self.fleet = Fleet(self._env(sources or BENCH_SOURCE), self._dir)
        self.ingresses: list[Process] = []
        self.ingress_port = free_port()
        self.workers: list[tuple[Process, str]] = []
        self.handled = 0  # messages the workers have acked so far, by the bench's count

    def _env(self, sources_text: str) -> dict[str, str]:
        sources = self._dir / "sources.toml"
        sources.write_text(sources_text)
        return {
            "AMQP_URL": self.amqp_url,
            "REDIS_URLS": REDIS_URL,
            "DATABASE_URL": self.database_url,
            "WEBHOOK_INGEST_NAMESPACE": self.namespace,
            "WEBHOOK_INGEST_SOURCES": str(sources),
            "LOG_FORMAT": "json",
        }

    @property
    def database_name(self) -> str:
        return self.database_url.rsplit("/", 1)[1]

    @property
    def redis_port(self) -> int:
        return urlsplit(REDIS_URL).port or 6379

    @property
    def events_queue(self) -> str:
        return topology.events_queue(self.namespace)

    async def __aenter__(self) -> "Deployment":
        await migrate(self.database_url)
        connection = await asyncpg.connect(self.database_url)
        try:
            await connection.execute(EFFECTS_TABLE)
        finally:
            await connection.close()
        return self

    async def __aexit__(self, *exc) -> None:
        self.fleet.stop_all()
        await self._drop_everything()
        if exc[0] is None:  # the processes' logs stay only after a failure
            shutil.rmtree(self._dir, ignore_errors=True)

    async def start_ingress(self, env: dict[str, str] | None = None) -> None:
        """The ingress processes `run` starts (sharing one port when several)."""
        commands = layout.ingress_commands("127.0.0.1", self.ingress_port, INGRESS_PROCESSES)
        self.ingresses = [self.fleet._start(argv, env) for argv in commands.values()]
        for ingress in self.ingresses:
            await wait_for_output(ingress, "broker_connected")

    async def start_workers(self, env: dict[str, str] | None = None) -> None:
        """The workers `run` starts, each with a metrics port to read its counts."""
        for argv in layout.worker_commands(WORKERS, CONCURRENCY, None).values():
            port = free_port()
            worker = self.fleet._start([*argv, "--metrics-port", str(port)], env)
            self.workers.append((worker, f"http://127.0.0.1:{port}"))
        for worker, _ in self.workers:
            await wait_for_output(worker, "worker_consuming")

    async def stop_processes(self) -> None:
        """SIGTERM to the ingress and the workers, and their exit waited for."""
        for process in [*self.ingresses, *(worker for worker, _ in self.workers)]:
            await asyncio.to_thread(process.terminate)
        self.ingresses, self.workers = [], []

    def pids(self) -> dict[str, list[int]]:
        return {
            "ingress": [ingress.pid for ingress in self.ingresses],
            "workers": [worker.pid for worker, _ in self.workers],
        }

    async def purge_events(self) -> None:
        connection = await aio_pika.connect(self.amqp_url)
        async with connection:
            channel = await connection.channel()
            await (await channel.get_queue(self.events_queue)).purge()

    async def fetchval(self, sql: str, *args):
        return await fetchval(self.database_url, sql, *args)

    async def _drop_everything(self) -> None:
        await _delete_queues(self.amqp_url, self.namespace)
        client = redis.from_url(REDIS_URL)
        try:
            keys = [key async for key in client.scan_iter(match=f"{self.namespace}:*", count=1000)]
            for start in range(0, len(keys), 1000):
                await client.delete(*keys[start : start + 1000])
        finally:
            await client.aclose()
        server = await asyncpg.connect(SERVER_URL)
        try:
            await server.execute(f'DROP DATABASE IF EXISTS "{self.database_url.rsplit("/", 1)[1]}" WITH (FORCE)')
        finally:
            await server.close()


async def _delete_queues(amqp_url: str, namespace: str) -> None:
    listing = await asyncio.create_subprocess_exec(
        *ctl_command(), "-q", "list_queues", "name", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    output = (await listing.communicate())[0].decode()
    names = [line.strip() for line in output.splitlines() if line.strip().startswith(f"{namespace}.")]
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        for name in names:
            with contextlib.suppress(aio_pika.exceptions.AMQPError):
                channel = await connection.channel()
                await channel.queue_delete(name)


async def fetchval(database_url: str, sql: str, *args):
    """One value, on a connection of its own (the bench's reads between phases)."""
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetchval(sql, *args)
    finally:
        await connection.close()


def peak_rss_mib(pid: int) -> float:
    """VmHWM: the most resident memory the process ever had."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmHWM for pid {pid}")
