"""Fixtures over the real services: every test gets its own namespace
(queues, Redis keys) and its own database, cloned from a migrated template.
RabbitMQ is the suite's own private node (tests/support/broker.py), never
the machine's shared broker.
"""

import asyncio
import os
import queue
import socket
import threading
import urllib.parse
import uuid

import aio_pika
import asyncpg
import pytest
import redis.asyncio as redis
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings

from tests.support import broker, polling_connections
from tests.support.processes import Fleet
from webhook_ingest.cli.migrate import migrate
from webhook_ingest.shared.settings import Settings

SERVER_URL = os.environ.get("TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
RUN_ID = uuid.uuid4().hex[:8]
TEMPLATE_DB = f"wi_template_{RUN_ID}"
NAMESPACE_PREFIX = f"t{RUN_ID}"

# No timing thresholds in tests, Hypothesis's own included: its deadline and
# too_slow health check measure the machine (2 shared cores, a parallel
# suite), not the code under test.
hypothesis_settings.register_profile("suite", deadline=None, suppress_health_check=[HealthCheck.too_slow])
hypothesis_settings.load_profile("suite")


def database_url(name: str) -> str:
    return SERVER_URL.rsplit("/", 1)[0] + "/" + name


async def _admin(sql: str) -> None:
    connection = await asyncpg.connect(SERVER_URL)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


NO_BROKER_NEEDED = ("tests/unit", "tests/sim")
WEDGED_MARKER = os.path.join("build", "test-broker-wedged")


def pytest_configure(config):
    """The private broker, unless every test asked for needs none (`make test-fast`)."""
    paths = [os.path.relpath(str(arg).split("::")[0]) for arg in config.args] or ["tests"]
    if _xdist_controller(config) or config.option.collectonly:
        return  # with `-n N` only the N workers run tests, each with its own node; `--co` runs none
    if not all(path.startswith(NO_BROKER_NEEDED) for path in paths):
        broker.start(wait=False)  # it boots while the tests are collected; broker_cleanup waits for it


def _xdist_controller(config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


def pytest_unconfigure(config):
    broker.stop()


def _broker_answers(timeout: float = 10) -> bool:
    """The AMQP handshake, not just the port."""
    parsed = urllib.parse.urlsplit(broker.amqp_url())
    try:
        with socket.create_connection((parsed.hostname, parsed.port or 5672), timeout=timeout) as sock:
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            return sock.recv(1) == b"\x01"  # a method frame: Connection.Start
    except OSError:
        return False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    # A RabbitMQ node that wedges mid-run (seen here: it accepts TCP and never
    # answers) would let every later test wait out its timeout. The node is
    # the suite's own: restart it empty, say so, and leave a marker, on
    # which .ci/run runs the suite once more (the failed test failed for it).
    report = (yield).get_result()
    if report.failed and broker.started() and not _broker_answers():
        if not broker.restart():
            item.session.shouldstop = "RabbitMQ stopped answering (TCP accepted, no AMQP handshake): run stopped"
            return
        os.makedirs(os.path.dirname(WEDGED_MARKER), exist_ok=True)
        with open(WEDGED_MARKER, "w") as marker:
            marker.write(item.nodeid + "\n")
        print(f"\n::warning:: the suite's RabbitMQ node stopped answering during {item.nodeid}: restarted it empty")


class _Clones:
    """Databases cloned from the migrated template ahead of the tests that
    take them, and dropped behind them, by one thread:
    a clone copies the template (~7.5 MB) through the WAL, 0.1-0.4 s that a
    test, mostly waiting on its processes, leaves the machine idle for.
    Dropped on the session's end: clones not taken, then the template."""

    AHEAD = 2
    _STOP = ("stop", "")

    def __init__(self, template: str) -> None:
        self.template = template
        self.jobs: queue.Queue[tuple[str, str]] = queue.Queue()
        self.ready: queue.Queue[str | BaseException] = queue.Queue()
        self.error: BaseException | None = None
        self.made = 0
        for _ in range(self.AHEAD):
            self.jobs.put(("clone", ""))
        self.thread = threading.Thread(target=asyncio.run, args=(self._serve(),), name="database-clones", daemon=True)
        self.thread.start()

    def take(self) -> str:
        """A fresh clone's name; the next one is started at once."""
        self.jobs.put(("clone", ""))
        clone = self.ready.get(timeout=120)
        if isinstance(clone, BaseException):
            raise clone
        return clone

    def drop(self, name: str) -> None:
        self.jobs.put(("drop", name))

    def close(self) -> None:
        """Drops what was not taken, waits for every drop; an error fails the session."""
        self.jobs.put(self._STOP)
        self.thread.join()
        if self.error is not None:
            raise self.error

    async def _serve(self) -> None:
        while (job := await asyncio.to_thread(self.jobs.get)) != self._STOP:
            await self._do(*job)
        while not self.ready.empty():
            if isinstance(clone := self.ready.get(), str):
                await self._do("drop", clone)

    async def _do(self, kind: str, name: str) -> None:
        # A connection per job, and a clone tried again once: a test may end
        # sessions that are not its own while a clone is being made for the next.
        try:
            if kind == "clone":
                self.made += 1
                name = f"wi_clone_{RUN_ID}_{self.made}"
                await self._clone(name)
                self.ready.put(name)
            else:
                await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except Exception as exc:  # noqa: BLE001 - a clone's error goes to the test taking it, a drop's to close()
            if kind == "clone":
                self.ready.put(exc)
            else:
                self.error = self.error or exc

    async def _clone(self, name: str) -> None:
        try:
            await _admin(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError):
            await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await _admin(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')


@pytest.fixture(scope="session")
def template_database():
    asyncio.run(migrate(database_url(TEMPLATE_DB)))
    clones = _Clones(TEMPLATE_DB)
    try:
        yield clones
    finally:
        try:
            clones.close()
        finally:
            asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}" WITH (FORCE)'))


# Namespaces whose tests ended, their queues not deleted yet. Deleted every
# few tests (one listing for many), not at the session's end: hundreds of
# live quorum queues at once wedged this machine's RabbitMQ 3.10 mid-run.
# The deletion runs beside the next test, one at a time, and an error fails
# the session. The listing is the private node's HTTP API (a few ms; it was
# `rabbitmqctl list_queues`, an Erlang VM start of 0.5-1.2 s CPU, hence the
# batches of 10), so the batches are small: fewer quorum queues stay alive.
FINISHED_NAMESPACES: list[str] = []
DELETE_EVERY = 3


class _QueueDeleter:
    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self, prefixes: tuple[str, ...]) -> None:
        self.thread = threading.Thread(target=self._run, args=(prefixes,), name="queue-deleter", daemon=True)
        self.thread.start()

    def busy(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def _run(self, prefixes: tuple[str, ...]) -> None:
        try:
            asyncio.run(_delete_queues(prefixes))
        except BaseException as exc:  # noqa: BLE001 - raised again in the main thread by join()
            self.error = exc

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()
        if self.error is not None:
            error, self.error = self.error, None
            raise error


QUEUE_DELETER = _QueueDeleter()


@pytest.fixture(scope="session", autouse=True)
def broker_cleanup():
    try:
        broker.await_started()  # before any test: launched by pytest_configure
    except RuntimeError as exc:
        pytest.exit(f"the suite's RabbitMQ node did not start: {exc}", returncode=1)
    yield
    QUEUE_DELETER.join()
    if broker.started():
        asyncio.run(_delete_queues((NAMESPACE_PREFIX,)))


def pytest_runtest_logfinish(nodeid, location):
    if len(FINISHED_NAMESPACES) >= DELETE_EVERY and not QUEUE_DELETER.busy() and broker.started():
        QUEUE_DELETER.join()  # the previous deletion's error, if any
        prefixes = tuple(FINISHED_NAMESPACES)
        FINISHED_NAMESPACES.clear()
        QUEUE_DELETER.start(prefixes)


async def _delete_queues(prefixes: tuple[str, ...]) -> None:
    names = [name for name in broker.queue_names() if name.startswith(prefixes)]
    if not names:
        return
    connection = await aio_pika.connect(broker.amqp_url())
    async with connection:
        for name in names:
            channel = await connection.channel()
            await channel.queue_delete(name)


@pytest.fixture
def namespace(request):
    name = f"{NAMESPACE_PREFIX}_{uuid.uuid4().hex[:10]}"
    yield name
    FINISHED_NAMESPACES.append(f"{name}.")


@pytest.fixture
async def database(template_database, namespace):
    """This test's database: a clone of the migrated template, renamed after its namespace."""
    name = f"wi_{namespace}"
    clone = await asyncio.to_thread(template_database.take)
    await _admin(f'ALTER DATABASE "{clone}" RENAME TO "{name}"')
    polling_connections.allow(database_url(name))
    yield database_url(name)
    await polling_connections.close(database_url(name))
    template_database.drop(name)


@pytest.fixture
async def redis_cleanup(namespace):
    yield
    client = redis.from_url(REDIS_URL)
    try:
        keys = [key async for key in client.scan_iter(match=f"{namespace}:*", count=1000)]
        if keys:
            await client.delete(*keys)
    except redis.ConnectionError:
        pass
    finally:
        await client.aclose()


@pytest.fixture
def service_env(namespace, database, redis_cleanup) -> dict[str, str]:
    """Environment for a process (or Settings) of this test's deployment."""
    return {
        "AMQP_URL": broker.amqp_url(),
        "REDIS_URLS": REDIS_URL,
        "DATABASE_URL": database,
        "WEBHOOK_INGEST_NAMESPACE": namespace,
        "LOG_FORMAT": "json",
    }


@pytest.fixture
def settings(service_env, monkeypatch) -> Settings:
    for name, value in service_env.items():
        monkeypatch.setenv(name, value)
    return Settings()


@pytest.fixture
def fleet(service_env, tmp_path):
    """Real `webhook-ingest` processes of this test's deployment; none outlives it."""
    fleet = Fleet(service_env, tmp_path)
    yield fleet
    fleet.stop_all()
