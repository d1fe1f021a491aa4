"""The key's lease in Postgres, and keeping a lock or a lease alive.

A run holds, besides the Redis lock (a hint) and the key's turn (an advisory
lock that ends with its session), a lease written to the key's fence row in
its own autocommit statement: it outlives the session that took it. So a
holder whose Postgres connection died — a partition, a proxy cut — while
its handler goes on calling the outside world still keeps every other
worker off the key until the lease runs out, and a holder that cannot
extend its lease does not complete under it. The lease is short
(`WEBHOOK_INGEST_LOCK_TTL`, 3 s) and extended every third of it, so a key
whose holder was killed is free again within seconds. The whole argument:
docs/design.md, "Exclusion".

The lease and the fencing token are one write: taking the lease registers
a new token for the key. Its statements are `workers.completions`'s.
"""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from webhook_ingest.shared import metrics
from webhook_ingest.shared.logging import get_logger
from webhook_ingest.workers.attempts import HandedOn

log = get_logger(__name__)
RENEW_RETRY_SECONDS = 0.2
SAFETY_MARGIN = 1 / 3  # of the TTL: what is left of a validity when it counts as lost


@dataclass(frozen=True)
class Lease:
    key: str
    token: int
    sent_at: float  # time.monotonic() before the statement that took it was sent
    handed_on: HandedOn = HandedOn()  # the key's last attempt handed on (workers.attempts)


class LockLost(Exception):
    """A lock or lease could not be kept while the handler ran: do not complete under it."""


class Keeper:
    """Keeps one lock or lease renewed while a handler runs; knows whether
    it was kept throughout.

    A failed renewal is tried again (a blip must not cost it). It counts as
    lost once a third of the TTL is all that is left of its validity since
    the last renewal that succeeded — a margin for the clocks and for what
    the handler's cancellation takes (`cancelled_when_lost`). The loss is
    decided by a timer, not by a renewal's answer: a renewal that hangs
    (a black-holed server) must not postpone it. Then the handler's work
    must not complete under it (`check`), and the event runs again later.
    """

    def __init__(self, name: str, renew: Callable[[], Awaitable[bool]], ttl_seconds: float,
                 valid_until: float | None = None):
        self.name = name
        self._renew = renew
        self._ttl = ttl_seconds
        self.valid_until = valid_until if valid_until is not None else time.monotonic() + ttl_seconds
        self.lost = False
        self.retired = False  # its lock ended (a done marker replaced it): nothing left to keep
        self._on_lost: list[Callable[[], None]] = []
        self._timer: asyncio.TimerHandle | None = None

    @property
    def deadline(self) -> float:
        """When it counts as lost, unless renewed before (time.monotonic())."""
        return self.valid_until - self._ttl * SAFETY_MARGIN

    def check(self) -> None:
        if self.lost or time.monotonic() > self.deadline:
            raise LockLost(self.name)

    def when_lost(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Calls `callback` (once) when it is lost; returns the function that unregisters it."""
        self._on_lost.append(callback)
        return lambda: self._on_lost.remove(callback)

    def retire(self) -> None:
        """Stops renewing (and losing) what is no longer ours to keep."""
        self.retired = True
        if self._timer is not None:
            self._timer.cancel()

    async def keep(self) -> None:
        self._arm()
        try:
            while not (self.lost or self.retired):
                await asyncio.sleep(self._ttl / 3)
                await self._renew_until_lost()
        finally:
            if self._timer is not None:
                self._timer.cancel()

    async def _renew_until_lost(self) -> None:
        while not (self.lost or self.retired):
            started = time.monotonic()
            try:
                renewed = await self._renew()
            except Exception:  # noqa: BLE001 - a failed renewal is retried below
                renewed = False
            if self.retired:
                return
            if renewed and not self.lost:
                self.valid_until = started + self._ttl * 0.99
                self._arm()
                return
            metrics.idempotency_store_errors.labels(self.name).inc()
            await asyncio.sleep(RENEW_RETRY_SECONDS)

    def _arm(self) -> None:
        """The loss, at the deadline (asyncio's clock is time.monotonic())."""
        if self._timer is not None:
            self._timer.cancel()
        if self.retired:
            return
        self._timer = asyncio.get_running_loop().call_at(self.deadline, self._lose)

    def _lose(self) -> None:
        self.lost = True
        log.warning("processing_lock_lost", holder=self.name)
        for callback in list(self._on_lost):
            callback()


@contextlib.contextmanager
def cancelled_when_lost(keeper: Keeper, connection):
    """The block's task is cancelled as soon as `keeper` is lost, and the
    block raises LockLost: a handler still calling the outside world stops
    before another worker can take the key (docs/design.md, "Exclusion").
    A handler that swallows the cancellation still gets LockLost here.

    `connection`, whose transaction holds the key's turn, is then closed
    rather than rolled back: a lease is lost because Postgres stopped
    answering, and a rollback sent into a black hole would wait as long as
    it lasts while the session kept the turn from every other worker."""
    task = asyncio.current_task()
    assert task is not None
    cancelled = False

    def cancel() -> None:
        nonlocal cancelled
        cancelled = True
        task.cancel()

    keeper.check()
    unregister = keeper.when_lost(cancel)
    try:
        yield
    except asyncio.CancelledError:
        if not cancelled or task.uncancel() > 0:
            raise  # someone else cancels us too (a shutdown): let it through
        _handler_stopped(keeper, connection)
        raise LockLost(keeper.name) from None
    except Exception:
        if not cancelled:
            raise
        task.uncancel()  # the handler turned its cancellation into an error: still ours, not its failure
        _handler_stopped(keeper, connection)
        raise LockLost(keeper.name)  # noqa: B904 - the handler's error stays as the context
    finally:
        unregister()
    if cancelled:  # the handler went on after the cancellation
        task.uncancel()
        _handler_stopped(keeper, connection)
        raise LockLost(keeper.name)


def _handler_stopped(keeper: Keeper, connection) -> None:
    metrics.handlers_cancelled.inc()
    log.warning("lease_lost_handler_cancelled", holder=keeper.name)
    connection.terminate()


@contextlib.asynccontextmanager
async def kept_alive(keepers: list[Keeper]) -> AsyncIterator[None]:
    """Renews the locks and leases while the block runs."""
    tasks = [asyncio.create_task(keeper.keep()) for keeper in keepers]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
