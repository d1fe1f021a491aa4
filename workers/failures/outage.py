"""Outages are not failures (docs/reference.md §7): telling them apart, and waiting them out.

An exception that says Postgres or RabbitMQ cannot be reached uses no
attempt. The message stays unacknowledged while the worker waits; since
every slot of the prefetch window ends up waiting too, the broker sends
nothing more — consuming pauses by itself, without a requeue loop that
would burn the quorum queue's delivery limit.
"""

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import aio_pika
import aiormq
import asyncpg

from webhook_ingest.shared import backoff
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.observability import get_logger, metrics

log = get_logger(__name__)

POSTGRES_LOST = (
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,  # e.g. "connection is closed"
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    asyncpg.CrashShutdownError,
    asyncpg.exceptions.ConnectionDoesNotExistError,
    asyncpg.ReadOnlySQLTransactionError,  # 25006: a demoted primary (a failover) refuses writes for a while
    asyncpg.TooManyConnectionsError,  # 53300: a full server refuses new sessions until others close
)
BROKER_LOST = (aio_pika.exceptions.AMQPError, aiormq.exceptions.AMQPError)
# OSError/TimeoutError count only outside handlers: a handler's own network
# error (say, forward's receiver is down) is a failure to retry, not ours.
_CONNECTION_LOST = (OSError, asyncio.TimeoutError)


T = TypeVar("T")


async def when_let_in(call: Callable[[], Awaitable[T]], key: str) -> T:
    """`call()`, again and again while the server refuses it a session for
    want of room (SQLSTATE 53300: max_connections, a role's limit). A full
    server answers: it is an outage to wait out where it is met — under the
    run's lease, kept alive meanwhile — never a reason to run the message
    again (docs/design.md, "Outages are not failures"). Only a refused
    connect is waited out here: it sent nothing, so asking again is safe."""
    refusals = 0
    for pause in backoff.pauses(first=0.05, most=1.0):
        try:
            return await call()
        except asyncpg.TooManyConnectionsError as exc:
            metrics.postgres_sessions_refused.inc()
            if not refusals:  # one line a run, however long it waits
                log.warning("postgres_session_refused", key=key, error=str(exc))
            refusals += 1
            await asyncio.sleep(pause)
    raise AssertionError("unreachable: backoff.pauses never ends")


def outage_kind(exc: BaseException, in_handler: bool = False) -> str | None:
    """'postgres', 'rabbitmq' or None (not an outage, a failure)."""
    if isinstance(exc, POSTGRES_LOST):
        return "postgres"
    if in_handler:
        return None
    if isinstance(exc, BROKER_LOST):
        return "rabbitmq"
    if isinstance(exc, _CONNECTION_LOST):
        return "postgres"  # our own calls that raise these are asyncpg's connects
    return None


def found_in_chain(
    exc: BaseException | None, kinds: type[BaseException] | tuple[type[BaseException], ...]
) -> BaseException | None:
    """The first exception of `kinds` in `exc`'s context chain. A handler that
    left a query running on `ctx.db` (say, `asyncio.gather` on it) makes the
    rollback fail too; that is still the handler's failure, not a Postgres
    outage (the pool discards the connection)."""
    while exc is not None:
        if isinstance(exc, kinds):
            return exc
        exc = exc.__context__
    return None


class OutageGate:
    """Messages hit by an outage wait here; one probe finds when it is over."""

    def __init__(self, probe, name: str):
        self._probe = probe  # async callable: raises while the service is down
        self._name = name
        self._over: asyncio.Event | None = None
        self._probing: asyncio.Task | None = None  # referenced: the loop keeps only a weak one

    async def wait(self, exc: BaseException) -> None:
        if self._over is None:
            self._over = asyncio.Event()
            log.warning("service_outage", service=self._name, error=describe(exc))
            self._probing = asyncio.create_task(self._probe_until_up(self._over))
        await self._over.wait()

    async def _probe_until_up(self, over: asyncio.Event) -> None:
        for pause in backoff.pauses():
            await asyncio.sleep(pause)
            try:
                await self._probe()
            except Exception:  # noqa: BLE001 - any failure means not yet
                continue
            break
        log.info("service_recovered", service=self._name)
        self._over = None
        over.set()
