"""The fault run's own deployment on this machine: a namespace and a
database, a private redis-server (the only Redis it flushes), one ingress
and three workers, each worker reaching Redis, Postgres and RabbitMQ through
its own TCP proxies so the schedule can cut them one by one. One worker is
pointed at a port where no Redis listens: it runs degraded from the start,
beside two that reach Redis (mixed modes, docs/reference.md §7).

Nothing here touches the shared services beyond this run's namespace and
database, and everything is removed at the end.
"""

import asyncio
import contextlib
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Self
from urllib.parse import urlsplit

import aio_pika
import asyncpg
import redis.asyncio as redis

from tests.chaos.handler import CHAOS_TABLES
from tests.chaos.ordering import ORDERING_TABLES
from tests.chaos.plan import MAX_ATTEMPTS, RETRY_DELAYS, Fault
from tests.support.broker import ctl_command
from tests.support.processes import ROOT, Fleet, Process, wait_for_output
from tests.support.redis_server import RedisServer
from tests.support.tcpproxy import TcpProxy, free_port
from webhook_ingest.cli import layout
from webhook_ingest.cli.migrate import migrate
from webhook_ingest.ingress.publishing.publisher import probe_queue
from webhook_ingest.shared.broker import topology

AMQP_URL = os.environ.get("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
SERVER_URL = os.environ.get("CHAOS_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
SOURCE, SECRET = "chaos", "chaos-secret"
PRUNE_WINDOW = "1s"  # the smallest `prune --older-than` accepts
# The ingress's archive sweep (shared/upkeep.py) every 2 s past a 5 s
# grace instead of every minute past a minute: what a killed worker's lost
# outcome batch left unsettled is settled by the deployment's own process
# within seconds of the drain, not two minutes (run.py waits for it).
SETTLE_SECONDS = 7.0
SWEEP_PRELUDE = (
    "from webhook_ingest.shared import upkeep as archive_upkeep\n"
    "archive_upkeep.SETTLE_GRACE_SECONDS, archive_upkeep.SETTLE_EVERY_SECONDS = 5.0, 2.0\n"
)


@dataclass
class WorkerSlot:
    """One of the three workers: its proxies stay, its process may be replaced."""

    env: dict[str, str]
    proxies: dict[str, TcpProxy] = field(default_factory=dict)
    process: Process | None = None


class LocalDeployment:
    def __init__(
        self,
        namespace: str | None = None,
        database_url: str | None = None,
        workers: int = 3,
        concurrency: int = layout.CONCURRENCY,
        lock_ttl: float = 3.0,
        work_ms: int = 100,
        log_dir: Path | None = None,
        keep_database: bool = False,
        routes: tuple[str, ...] = (),
        downstream_url: str = "",
        ordering: str = "",
    ):
        run_id = uuid.uuid4().hex[:8]
        self.namespace = namespace or f"chaos_{run_id}"
        self.owns_database = database_url is None
        self.keep_database = keep_database
        self.database_url = database_url or SERVER_URL.rsplit("/", 1)[0] + f"/wi_chaos_{run_id}"
        self.amqp_url = AMQP_URL
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="wi-chaos-"))
        self.redis = RedisServer()
        self.worker_count, self.concurrency, self.lock_ttl, self.work_ms = workers, concurrency, lock_ttl, work_ms
        self.degraded_worker = workers - 1
        self.routes = routes  # the source's routes, each running the recorder (docs/reference.md §3); none: one handler
        self.downstream_url = downstream_url  # where the recorder makes its external call (none: no call)
        # "keys": the ordered recorder on a source ordered by `body:object` (tests/chaos/ordering.py);
        # "off": the same recorder, the source not ordered (a baseline check_order should fault); "": neither
        self.ordering = ordering
        self.fleet: Fleet | None = None
        self.slots: list[WorkerSlot] = []
        self.base_url = ""
        self.prunes: list[tuple[float, float]] = []  # wall-clock (start, end) of each prune
        self.pids: dict[int, str] = {}  # every worker process that ran -> "worker N", for the report
        self.tasks: set[asyncio.Task] = set()

    # -- start and stop ----------------------------------------------------------

    async def __aenter__(self) -> Self:
        try:
            await self._start_everything()
        except BaseException:
            await self.__aexit__(None, None, None)  # a half-started run leaves nothing behind either
            raise
        return self

    async def _start_everything(self) -> None:
        if self.owns_database:
            await migrate(self.database_url)
        await _execute(self.database_url, CHAOS_TABLES + (ORDERING_TABLES if self.ordering else ""))
        self.redis.start()
        self.fleet = Fleet(self._base_env(), self.log_dir)
        _, self.base_url = self.fleet.ingress(prelude=SWEEP_PRELUDE)
        self.slots = [self._slot(n) for n in range(self.worker_count)]  # before any start: _start reads the index
        for slot in self.slots:
            self._start(slot)
        for slot in self.slots:
            await wait_for_output(slot.process, "worker_consuming", timeout=60)

    async def __aexit__(self, *exc) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.fleet is not None:
            self.fleet.stop_all()
        for slot in self.slots:
            for proxy in slot.proxies.values():
                proxy.stop()
        self.redis.stop()
        await delete_queues(self.amqp_url, self.namespace)
        if self.owns_database and not self.keep_database:
            await _execute(SERVER_URL, f'DROP DATABASE IF EXISTS "{_database_name(self.database_url)}" WITH (FORCE)')

    def _base_env(self) -> dict[str, str]:
        sources = self.log_dir / "sources.toml"
        called = f', downstream_url = "{self.downstream_url}"' if self.downstream_url else ""
        options = (
            f'handler_options = {{ runs_database_url = "{self.database_url}", work_ms = "{self.work_ms}"{called} }}\n'
        )
        handling = "".join(
            f'[[sources.{SOURCE}.routes]]\nname = "{route}"\nhandler = "tests.chaos.handler:record"\n{options}'
            for route in self.routes
        )
        handler = "tests.chaos.ordering:record" if self.ordering else "tests.chaos.handler:record"
        sources.write_text(
            f'[sources.{SOURCE}]\nscheme = "hmac-sha256"\nsecrets = ["{SECRET}"]\nevent_id = ["body:id"]\n'
            f"max_attempts = {MAX_ATTEMPTS}\nretry_delays = {list(RETRY_DELAYS)}\n"
            + (handling if self.routes else f'handler = "{handler}"\n{options}')
            + (f'[sources.{SOURCE}.ordering]\nkey = "body:object"\n' if self.ordering == "keys" else "")
        )
        return {
            "AMQP_URL": self.amqp_url,
            "REDIS_URLS": self.redis.url,
            "DATABASE_URL": self.database_url,
            "WEBHOOK_INGEST_NAMESPACE": self.namespace,
            "WEBHOOK_INGEST_SOURCES": str(sources),
            "WEBHOOK_INGEST_LOCK_TTL": str(self.lock_ttl),
            "LOG_FORMAT": "json",
            "PYTHONPATH": str(ROOT),
        }

    def _slot(self, n: int) -> WorkerSlot:
        targets = {"postgres": self.database_url, "rabbitmq": self.amqp_url}
        if n != self.degraded_worker:
            targets["redis"] = self.redis.url
        slot = WorkerSlot(env={})
        for service, url in targets.items():
            parts = urlsplit(url)
            proxy = TcpProxy(parts.hostname, parts.port).start()
            slot.proxies[service] = proxy
            slot.env[_ENV_NAMES[service]] = proxy.url_for(url)
        if n == self.degraded_worker:
            slot.env["REDIS_URLS"] = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
        return slot

    def _start(self, slot: WorkerSlot) -> None:
        slot.process = self.fleet.worker("--concurrency", str(self.concurrency), "--grace-seconds", "5", env=slot.env)
        number = self.slots.index(slot)
        self.pids[slot.process.pid] = f"worker {number}" + (", degraded" if number == self.degraded_worker else "")

    async def stop_workers(self) -> None:
        """SIGTERM every worker (SIGKILL after the grace): what they held unacked goes back to ready."""
        await asyncio.gather(
            *(asyncio.to_thread(slot.process.terminate, 20) for slot in self.slots), return_exceptions=True
        )
        for slot in self.slots:
            slot.process.kill()

    def worker_logs(self) -> list[Path]:
        return [process.log_path for process in self.fleet.processes]

    # -- faults ------------------------------------------------------------------

    async def run_faults(self, faults: list[Fault]) -> list[str]:
        """Each fault at its planned time; returns a line per fault as it was applied."""
        started, applied = time.monotonic(), []
        for fault in faults:
            await asyncio.sleep(max(0.0, started + fault.at - time.monotonic()))
            wall = datetime.now(UTC).strftime("%H:%M:%S.%f")[:-3]  # to set beside the logs and tables
            applied.append(f"{wall}Z {time.monotonic() - started:6.1f}s  {fault.describe()}")
            task = asyncio.create_task(self._apply(fault))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        await asyncio.gather(*list(self.tasks))
        return applied

    async def _apply(self, fault: Fault) -> None:
        match fault.action:
            case "kill":
                slot = self.slots[fault.worker]
                slot.process.kill()
                await asyncio.sleep(fault.seconds)
                if slot.process.popen.poll() is not None:  # not already restarted by an overlapping kill
                    self._start(slot)
            case "cut":
                proxy = self.slots[fault.worker].proxies[fault.service]
                proxy.cut()
                await asyncio.sleep(fault.seconds)
                proxy.restore()
            case "flush":
                client = redis.from_url(self.redis.url)
                try:
                    await client.flushall()
                finally:
                    await client.aclose()
            case "prune":
                await self._prune()

    async def _prune(self) -> None:
        started = time.time()
        env = {**os.environ, **self.fleet.env, "PYTHONPATH": str(ROOT)}
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "webhook_ingest",
            "prune",
            "--older-than",
            PRUNE_WINDOW,
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        await process.wait()
        self.prunes.append((started, time.time()))

    def all_restored(self) -> None:
        for slot in self.slots:
            for proxy in slot.proxies.values():
                proxy.restore()


_ENV_NAMES = {"postgres": "DATABASE_URL", "rabbitmq": "AMQP_URL", "redis": "REDIS_URLS"}


def _database_name(url: str) -> str:
    return url.rsplit("/", 1)[1].split("?", 1)[0]


async def _execute(database_url: str, sql: str) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


async def namespace_queues(amqp_url: str, namespace: str, events_only: bool = False) -> list[str]:
    """The namespace's queues, as `rabbitmqctl` lists them (this machine's
    broker); `events_only`: not the ingress's probe queue, which keeps one
    message of its own by design."""
    listing = await asyncio.create_subprocess_exec(
        *ctl_command(), "-q", "list_queues", "name", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    output = (await listing.communicate())[0].decode()
    names = sorted(line.strip() for line in output.splitlines() if line.strip().startswith(f"{namespace}."))
    return [name for name in names if not (events_only and name == probe_queue(namespace))]


async def delete_queues(amqp_url: str, namespace: str) -> None:
    names = await namespace_queues(amqp_url, namespace)
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        for name in names:
            with contextlib.suppress(aio_pika.exceptions.AMQPError):
                channel = await connection.channel()
                await channel.queue_delete(name)


def known_queues(namespace: str) -> list[str]:
    """The queues a deployment with this run's retry delays declares (when `rabbitmqctl` is not at hand)."""
    return [
        topology.events_queue(namespace),
        topology.dead_queue(namespace),
        *(topology.retry_queue(namespace, delay) for delay in RETRY_DELAYS),
    ]
