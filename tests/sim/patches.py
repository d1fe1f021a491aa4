"""Where the simulation reaches into the product: module attributes swapped
for the length of one run, and nothing else.

- `time` in the worker modules (and the in-memory store) reads the
  virtual clock: leases, lock validity, Redis degraded mode, metrics;
- `uuid` in `workers.claim.redlock` and `shared.event.message` counts instead of
  drawing (lock values, message ids): the same seed, the same trace;
- the I/O constructors `Worker.run()` calls: `asyncpg.create_pool` (the
  simulated pools, sized by the worker's own code), `CompletionStore` (the
  simulated server's client on those pools), `idempotency._client` (the
  simulated Redis masters), `amqp.connect_robust` (the simulated broker);
  `record_dead_letter` in `workers.claim.retry` (the dead-letter insert),
  `record_failure` wherever the worker counts a failure in its incident
  (the simulated server's: an incident row locked until its transaction
  ends, with the real lock timeout), and `PausedSources` (no source is
  paused in a simulation);
- `loop_lag.of_running_loop` gives each process its own monitor (they
  share one simulated loop; a real process has its own);
- `Processor.call_handler` is wrapped to tell the handler which message
  it runs (the handler's `Event` has no chain id), without changing what
  it does;
- each worker module's `log` is a fresh structlog logger, configured to
  write into the run's trace instead of stderr.
"""

import contextlib
import importlib
import importlib.util
import itertools
import logging
import uuid
from contextvars import ContextVar
from types import SimpleNamespace
from unittest import mock

import asyncpg
import structlog

from tests.sim import handlers
from tests.sim.loop import PROCESS, VirtualTime
from tests.sim.postgres import Client, Pool, SimSession
from webhook_ingest.shared.event.message import EventMessage

TIMED_MODULES = (
    "webhook_ingest.workers.claim.lease",
    "webhook_ingest.workers.claim.redlock",
    "webhook_ingest.workers.claim.idempotency",
    "webhook_ingest.workers.claim.completions",
    "webhook_ingest.workers.worker",
    "webhook_ingest.workers.claim.processor",
    "webhook_ingest.workers.claim.batch",
    "tests.support.in_memory",
)
LOGGING_MODULES = (
    "claim.processor",
    "claim.batch",
    "worker",
    "claim.copies",
    "acks",
    "claim.retry",
    "claim.lease",
    "claim.idempotency",
    "claim.completions",
    "failures.outage",
)
MESSAGE: ContextVar[EventMessage | None] = ContextVar("sim_message", default=None)


class _Asyncpg:
    """asyncpg as `workers.worker` sees it: its pools are simulated."""

    def __init__(self, sim):
        self._sim = sim

    async def create_pool(self, dsn=None, *, max_size: int = 10, **_):
        return Pool(self._sim.loop, max_size, self._sim.server)

    def __getattr__(self, name: str):
        return getattr(asyncpg, name)


async def _no_pooler(database_url) -> None:
    """The simulated server is reached directly."""


async def _schema_current(pool) -> None:
    """The simulated Postgres is always of this release's schema."""


class _NothingPaused:
    def __init__(self, pool) -> None:
        pass

    async def refresh(self) -> None:
        pass

    def __contains__(self, source: str) -> bool:
        return False


@contextlib.contextmanager
def patched(sim):
    worker = importlib.import_module("webhook_ingest.workers.worker")
    processor = importlib.import_module("webhook_ingest.workers.claim.processor")
    counter = itertools.count(1)
    counting_uuid = SimpleNamespace(uuid4=lambda: uuid.UUID(int=next(counter)))
    virtual = VirtualTime(sim.loop)
    original_call_handler = processor.Processor.call_handler

    async def call_handler(self, *args, **kwargs):
        message = next((a for a in (*args, *kwargs.values()) if isinstance(a, EventMessage)), None)
        token = MESSAGE.set(message)
        try:
            return await original_call_handler(self, *args, **kwargs)
        finally:
            MESSAGE.reset(token)

    async def connect_robust(url, **_):
        return sim.connect()

    with contextlib.ExitStack() as stack:
        for name in TIMED_MODULES:
            module = importlib.import_module(name)
            if hasattr(module, "time"):
                stack.enter_context(mock.patch.object(module, "time", virtual))
        stack.enter_context(mock.patch("webhook_ingest.workers.claim.redlock.uuid", counting_uuid))
        stack.enter_context(
            mock.patch("webhook_ingest.shared.event.message.new_message_id", lambda: counting_uuid.uuid4().hex)
        )
        stack.enter_context(mock.patch.object(worker, "asyncpg", _Asyncpg(sim)))
        stack.enter_context(
            mock.patch.object(
                worker,
                "CompletionStore",
                lambda pool, renewals=None, transactions=None: Client(
                    sim.server, pool, renewals or pool, transactions or pool
                ),
            )
        )
        stack.enter_context(mock.patch("webhook_ingest.workers.claim.idempotency._client", sim.redis_client))
        stack.enter_context(mock.patch("webhook_ingest.shared.broker.amqp.connect_robust", connect_robust))
        stack.enter_context(
            mock.patch("webhook_ingest.workers.claim.retry.record_dead_letter", sim.server.record_dead_letter)
        )
        for module in ("webhook_ingest.workers.claim.retry", "webhook_ingest.workers.failures.incident_counts"):
            if importlib.util.find_spec(module) is not None and hasattr(
                importlib.import_module(module), "record_failure"
            ):
                stack.enter_context(mock.patch(f"{module}.record_failure", sim.server.record_failure))
        if importlib.util.find_spec("webhook_ingest.workers.claim.loop_lag") is not None:
            stack.enter_context(
                mock.patch("webhook_ingest.workers.claim.loop_lag.of_running_loop", _lag_per_process(sim))
            )
        stack.enter_context(mock.patch.object(worker, "PausedSources", _NothingPaused))
        stack.enter_context(mock.patch.object(worker.schema, "require_migrations", _schema_current))
        stack.enter_context(mock.patch.object(worker.pooler, "refuse_transaction_pooling", _no_pooler))
        stack.enter_context(mock.patch.object(processor.Processor, "call_handler", call_handler))
        stack.enter_context(mock.patch("tests.support.in_memory.Session", SimSession))
        stack.enter_context(mock.patch.object(SimSession, "server", sim.server))
        stack.enter_context(mock.patch.object(handlers, "SIMULATION", sim))
        stack.enter_context(_logs_into(sim))
        yield


def _lag_per_process(sim):
    """`loop_lag.of_running_loop` for processes that share one simulated
    loop: each process its own monitor, ticking in its own context (so its
    pauses and lag are its own), and silent once the process is dead."""
    from webhook_ingest.workers.claim import loop_lag

    class ProcessLag(loop_lag.LoopLag):
        def _tick(self) -> None:
            if PROCESS.get() not in sim.net.dead:
                super()._tick()

    monitors: dict[str | None, loop_lag.LoopLag] = {}

    def of_running_loop() -> loop_lag.LoopLag:
        process = PROCESS.get()
        if process not in monitors:
            monitors[process] = ProcessLag()
        return monitors[process]

    return of_running_loop


@contextlib.contextmanager
def _logs_into(sim):
    def capture(logger, method_name, event_dict):
        sim.logged(event_dict)
        raise structlog.DropEvent

    previous = structlog.get_config()
    structlog.configure(
        processors=[structlog.contextvars.merge_contextvars, capture],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.ReturnLoggerFactory(),
        cache_logger_on_first_use=False,
    )
    try:
        with contextlib.ExitStack() as stack:
            for name in LOGGING_MODULES:
                module = importlib.import_module(f"webhook_ingest.workers.{name}")
                if hasattr(module, "log"):
                    stack.enter_context(mock.patch.object(module, "log", structlog.get_logger(module.__name__)))
            yield
    finally:
        structlog.configure(**previous)
