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
a new token for the key. Its statements are `workers.claim.completions`'s.
"""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from webhook_ingest.shared.observability import get_logger, metrics

from . import loop_lag
from .attempts import HandedOn

log = get_logger(__name__)
RENEW_RETRY_SECONDS = 0.2
SAFETY_MARGIN = 1 / 3  # of the TTL: what is left of a validity when it must be confirmed
CONFIRM_MARGIN = 1 / 6  # of the TTL: what is left of a validity when an unanswered confirmation loses it
LATE_CONFIRM_SHARE = 1.0  # of the TTL: how long a confirmation asked for past that, or on a lagging loop, may take
LAGGING_SHARE = 1 / 12  # of the TTL: the loop behind this long in all while a confirmation waited: not a black hole
SLOW_SHARE = 1 / 10  # of the time since it was due: the loop behind this much of it (a slow loop): not a black hole
HEARING_ITERATIONS = 3  # of the loop, at the limit: an answer already come in is run by then (`_unanswered`)


@dataclass(frozen=True)
class Lease:
    key: str
    token: int
    sent_at: float  # time.monotonic() before the statement that took it was sent
    handed_on: HandedOn = field(default_factory=HandedOn)  # the key's last attempt handed on (workers.claim.attempts)


class LockLost(Exception):
    """A lock or lease could not be kept while the handler ran: do not complete under it."""


class Keeper:
    """Keeps one lock or lease renewed while a handler runs; knows whether
    it was kept throughout.

    A failed renewal is tried again (a blip must not cost it). At its
    deadline — a third of the TTL left of its validity since the last
    renewal that succeeded, by its own clock — it asks once more before it
    gives up (`_confirm`): that clock may have run on while the process
    stood still (a pause, a loaded loop), and a lease whose fencing token
    is still the key's was taken by no one meanwhile, so it is extended and
    the run goes on, even past the TTL. It is lost when the answer is "not
    ours", or when none comes within a sixth of the TTL: a timer decides,
    not the answer, which a black-holed server may never give — after a
    few loop iterations that run an answer already come in, and unless the
    loop stood still or was slow meanwhile (`loop_lag`), too busy to hear
    an answer that came: then a TTL from when it was asked, and longer
    while it stays slow. Then the
    handler's work must not complete under it (`check`,
    `cancelled_when_lost`), and the event runs again later. Why asking is
    safe: docs/design.md, "A lock that cannot be kept".
    """

    def __init__(
        self,
        name: str,
        renew: Callable[[], Awaitable[bool]],
        ttl_seconds: float,
        valid_until: float | None = None,
        refusal_is_final: bool = True,
    ):
        self.name = name
        self._renew = renew
        # False from Postgres means "not ours"; from Redis, also "no quorum answered"
        self._refusal_is_final = refusal_is_final
        self._ttl = ttl_seconds
        self.valid_until = valid_until if valid_until is not None else time.monotonic() + ttl_seconds
        self.lost = False
        self.lost_because = ""  # "refused": Postgres said the key is not ours; "unanswered": no answer in time
        self.retired = False  # its lock ended (a done marker replaced it): nothing left to keep
        self._on_lost: list[Callable[[], None]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._confirming: asyncio.Task | None = None
        self._hearing: asyncio.Task | None = None
        self._confirm_asked = 0.0
        self._slow_since = 0.0  # how slow the loop was is reckoned from here at an unanswered confirmation's limit
        self._lag: loop_lag.LoopLag | None = None

    @property
    def deadline(self) -> float:
        """When it is confirmed or lost, unless renewed before (time.monotonic())."""
        return self.valid_until - self._ttl * SAFETY_MARGIN

    def check(self) -> None:
        """Raises LockLost once it is lost. Past its deadline but not lost
        yet, its confirmation is on its way: a completion sent meanwhile is
        still refused unless its fencing token is the key's."""
        if self.lost:
            raise LockLost(self.name)

    def when_lost(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Calls `callback` (once) when it is lost; returns the function that unregisters it."""
        self._on_lost.append(callback)
        return lambda: self._on_lost.remove(callback)

    def retire(self) -> None:
        """Stops renewing (and losing) what is no longer ours to keep."""
        self.retired = True
        self._disarm()

    async def keep(self) -> None:
        self.start()
        try:
            await asyncio.sleep(self.renew_every)
            await self.renewing()
        finally:
            self._disarm()

    @property
    def renew_every(self) -> float:
        return self._ttl / 3

    def start(self) -> None:
        """Arms the confirmation at the deadline; renewing is `renewing`'s,
        from the first renewal's time on (`kept_alive`)."""
        self._lag = loop_lag.of_running_loop()  # watching before any pause its confirmation must tell from a black hole
        self._arm()

    def stop(self) -> None:
        """What `start` armed, and a confirmation on its way, cancelled."""
        self._disarm()

    async def renewing(self) -> None:
        """Renews now, then every third of the TTL, until lost or retired."""
        while not (self.lost or self.retired):
            await self._renew_until_lost()
            if self.lost or self.retired:
                return
            await asyncio.sleep(self.renew_every)

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
                self._renewed(started)
                return
            metrics.idempotency_store_errors.labels(self.name).inc()
            await asyncio.sleep(RENEW_RETRY_SECONDS)

    def _renewed(self, started: float) -> None:
        self.valid_until = max(self.valid_until, started + self._ttl * 0.99)
        self._arm()

    def _arm(self) -> None:
        """The confirmation, at the deadline (asyncio's clock is time.monotonic())."""
        self._disarm()
        if not (self.retired or self.lost):
            self._timer = asyncio.get_running_loop().call_at(self.deadline, self._confirm)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for task in (self._confirming, self._hearing):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        self._confirming = self._hearing = None

    def _confirm(self) -> None:
        """Our clock says it may run out: ask, and lose it unless the answer
        is "still ours" by the time a sixth of the TTL is left of it, or,
        when the process stood still past that or meanwhile (`_unanswered`),
        within a TTL."""
        loop = asyncio.get_running_loop()
        self._confirm_asked = loop.time()
        self._slow_since = self.deadline
        lose_at = self.valid_until - self._ttl * CONFIRM_MARGIN
        if loop.time() > lose_at:  # the key may be another's already: only the answer tells
            lose_at = loop.time() + self._ttl * LATE_CONFIRM_SHARE
        self._timer = loop.call_at(lose_at, self._unanswered)
        self._confirming = asyncio.create_task(self._confirmed(), name=f"confirm-{self.name}")

    def _unanswered(self) -> None:
        """No answer by the limit: first let the loop run what has come in
        meanwhile (`_heard_before_lost`); then a black hole, unless the loop
        was slow since the confirmation was due, or since the last limit
        (`_loop_was_slow`): then the answer may have come and wait to be
        heard, and gets until a TTL after it was asked, or, past that,
        another sixth of the TTL (issue 35)."""
        self._timer = None
        self._hearing = asyncio.create_task(self._heard_before_lost(), name=f"hear-{self.name}")

    async def _heard_before_lost(self) -> None:
        """An answer already read from the socket, or waiting there, reaches
        `_confirmed` within a few of the loop's iterations (the protocol's
        callback, the statement's future, the batch's, our task): a timer
        that fired in the same iteration must not beat it. A renewal meanwhile
        cancels this task (`_arm`)."""
        for _ in range(HEARING_ITERATIONS):
            await asyncio.sleep(0)
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._loop_was_slow(self._slow_since, now):
            self._hearing = None
            self._slow_since = now
            next_limit = max(self._confirm_asked + self._ttl * LATE_CONFIRM_SHARE, now + self._ttl * CONFIRM_MARGIN)
            self._timer = loop.call_at(next_limit, self._unanswered)
            return
        self._lose("unanswered")

    def _loop_was_slow(self, since: float, now: float) -> bool:
        """Whether the loop, since `since`, stood still a twelfth of the TTL
        in all (a pause) or was behind a tenth of that time (a loop slow at
        every step: a loaded host, seed 361)."""
        if self._lag is None:
            return False
        behind = self._lag.stood_still_since(since)
        return behind >= self._ttl * LAGGING_SHARE or behind >= (now - since) * SLOW_SHARE

    async def _confirmed(self) -> None:
        """Asks until answered; the timer set by `_confirm` ends it."""
        while True:
            started = time.monotonic()
            try:
                renewed = await self._renew()
            except Exception:  # noqa: BLE001 - no answer: asked again, until the timer decides
                renewed = None
            if self.lost or self.retired:
                return
            if renewed:
                return self._renewed(started)
            if renewed is False and self._refusal_is_final:
                return self._lose("refused")  # "not ours": another run took it, or it ended
            await asyncio.sleep(RENEW_RETRY_SECONDS)

    def _lose(self, because: str) -> None:
        if self.lost:
            return
        self.lost, self.lost_because = True, because
        self._disarm()
        log.warning("processing_lock_lost", holder=self.name, lost=because)
        for callback in list(self._on_lost):
            callback()


@contextlib.contextmanager
def cancelled_when_lost(keeper: Keeper, connection):
    """The block's task is cancelled as soon as `keeper` is lost, and the
    block raises LockLost: a handler still calling the outside world stops
    before another worker can take the key (docs/design.md, "A lock that
    cannot be kept").
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
        raise LockLost(keeper.name)  # the handler's error stays as the context


def _handler_stopped(keeper: Keeper, connection) -> None:
    metrics.handlers_cancelled.inc()
    log.warning("lease_lost_handler_cancelled", holder=keeper.name, lost=keeper.lost_because)
    connection.terminate()


@contextlib.asynccontextmanager
async def kept_alive(keepers: list[Keeper]) -> AsyncIterator[None]:
    """Renews the locks and leases while the block runs. A keeper's task
    starts when its first renewal is due (a third of the TTL, 1 s): a run
    shorter than that — a `forward` to a downstream answering in 300 ms —
    costs a timer, not a task to create, cancel and wait for (issue 39)."""
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task] = []

    def start_renewing(keeper: Keeper) -> None:
        tasks.append(loop.create_task(keeper.renewing()))

    timers = []
    for keeper in keepers:
        keeper.start()
        timers.append(loop.call_later(keeper.renew_every, start_renewing, keeper))
    try:
        yield
    finally:
        for timer in timers:
            timer.cancel()
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for keeper in keepers:
            keeper.stop()
