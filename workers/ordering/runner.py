"""A worker's lanes: it takes an ordering key's lane when woken, runs its
pending rows one after another in order, and lets it go once nothing is
left (docs/design.md, "Ordering keys").

- **Offers.** A wake-up from NS.ordering (acked at once: the rows are
  durable in Postgres, a wake-up is a hint) or the watchdog's timer offers a
  lane. The runner takes it unless it holds it already, is stopping, or the
  lane's source is unknown here or paused. Holding its `capacity` (the
  worker's `--concurrency`) of lanes, it keeps the lane offered (up to
  WAITING_LANES, in order) and offers it again when a slot frees up; past
  that, it notes a backlog for a look.
- **Takes.** The lane's lease and a new fencing token on its `ordering_keys`
  row, granted by Postgres only while the lane has rows pending, is not
  blocked, its lease is free or ran out and its `ready_at` has come. A
  `Keeper` keeps it (renewals shared across lanes, one statement at a
  time): past its deadline it asks Postgres before it gives the lane up, and
  a lost lane cancels the row running (docs/design.md, "A lock that cannot
  be kept").
- **Drains.** Pages of up to PAGE_ROWS rows (HOT_PAGE_ROWS after a full
  one) in run order (`by` NULLS LAST, seq), each through the unchanged
  per-event claim (`Processor.run_ordered`, with `EventMessage.ordered`,
  its `ctx.db` opened early for a handler that queries soon): its completion advances the lane in the
  same commit, fenced by the lane's token. A row of a batchable handler
  goes first to `LaneHeads`: the heads of many lanes in one transaction
  (BatchProcessor.run_heads), falling back to its own pass when the batch
  did not run it. Takes, pages and lets-go of many lanes share one
  statement each (`LaneStatements`, workers/ordering/coalesced.py). A row found done elsewhere is
  finished (deleted, fenced). A retry, a deferral or a blocking dead letter
  let the lane go (workers/ordering/failures.py), and the runner stops.
  A source whose lanes hold (`ordering.hold`) is run once its
  earliest-accepted pending row has waited the hold; before that the lane
  is let go with `ready_at` then.
- **Lets go.** `release_if_idle`: only when nothing is pending, read on the
  locked row, so an insert committed first keeps it held and one committed
  after finds it idle and wakes it. A stop, a pause or a lost lane let go
  whatever is pending.
- **Watchdog.** Each second one indexed statement: lanes of the sources
  ordered here (or, ordering removed, whose lanes hold rows: asked every
  LEFTOVERS_SECONDS, and any source of a lane offered here since), not
  paused, of a route the file has (a removed route's lanes never fill the
  look), pending and unblocked, whose lease is free or ends — and whose
  `ready_at` comes — within the second, at most the free slots; each gets a
  timer at the wait Postgres computed (+ 0–50 ms jitter). A lost wake-up, a
  killed holder's lane, a retry's delay or a hold costs nothing until then.
  No such source: no statement (but the leftovers' question each minute).
"""

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial
from typing import Any, Protocol

from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.event import EventMessage, OrderedStep
from webhook_ingest.shared.observability import get_logger, tracing
from webhook_ingest.shared.ordering import event_of
from webhook_ingest.shared.sources import Source
from webhook_ingest.workers.claim import Keeper, Lease, Outcome, kept_alive

from .coalesced import LaneHeads, LaneStatements
from .failures import blocks
from .renewals import LaneRenewals
from .store import LaneStore, Page, PendingRow

log = get_logger(__name__)
PAGE_ROWS = 32
# A lane whose last page was full (a hot key) reads its next ones this big, on a statement of its own:
# three statements a page (the rows, their leases, their completions) spread over more rows.
HOT_PAGE_ROWS = 128
# Lanes offered while full, kept to be offered as slots free up: a burst of wake-ups then costs no
# watchdog look per freed slot (each sorts the runnable lanes: ~2 ms of Postgres over 10,000).
WAITING_LANES = 10_000
WATCH_SECONDS = 1.0
# How often a worker with a source not ordered asks which sources' lanes still hold rows (ordering
# removed: they drain): one GROUP BY a minute, not a second; a lane offered here joins at once.
LEFTOVERS_SECONDS = 60.0
JITTER_SECONDS = 0.05
# A row's outcome after which the lane goes on: its completion advanced it
# (PROCESSED, STALE), or it is finished here (DUPLICATE, CONFLICT: done elsewhere).
_GOES_ON = (Outcome.PROCESSED, Outcome.STALE)
_FINISHED_HERE = (Outcome.DUPLICATE, Outcome.CONFLICT)

Settled = Callable[[EventMessage, Outcome, float], None]
UntilDone = Callable[[Callable[[Any], Awaitable[Any]], Any], Coroutine[Any, Any, Any]]


DeadUnrun = Callable[[EventMessage, Source, dict], Awaitable[Outcome]]


class PageLeases(Protocol):
    """What the runner asks of the rows' Processor to lease a page's rows at once (Processor's methods)."""

    async def lease_rows(self, keys: list[str]) -> tuple[dict[str, Lease], dict[str, str]]: ...
    async def run_leased(self, message: EventMessage, lease: Lease, completed_sha256: str | None) -> Outcome: ...
    async def release_leases(self, leases: list[Lease]) -> None: ...
    def lease_keeper(self, leases: list[Lease]) -> Keeper: ...


class Paused(Protocol):
    """The sources paused now (workers/pauses.py, PausedSources)."""

    def __contains__(self, source: str, /) -> bool: ...


async def _just_run(process: Callable[[Any], Awaitable[Any]], work: Any) -> Any:
    return await process(work)


def source_and_route(lane: str) -> tuple[str, str]:
    """A lane `SOURCE[#ROUTE]:VALUE`'s source and route ("" none)."""
    head = lane.partition(":")[0]
    source, _, route = head.partition("#")
    return source, route


class LaneRunner:
    def __init__(
        self,
        store: LaneStore,
        run: Callable[[EventMessage], Awaitable[Outcome]],
        sources: dict[str, Source],
        paused: Paused,
        holder: str,
        capacity: int,
        ttl_ms: int,
        settled: Settled,
        until_done: UntilDone | None = None,
        dead_unrun: DeadUnrun | None = None,
        delivery_limit: int | None = None,
        pages: PageLeases | None = None,
        heads: LaneHeads | None = None,
    ):
        self._store = store
        self._run = run  # Processor.run_ordered (the ordered rows' Processor)
        self._sources = sources
        self._paused = paused
        self._holder = holder
        self._capacity = capacity
        self._ttl_ms = ttl_ms
        self._settled = settled
        self._until_done = until_done or _just_run
        self._pages = pages  # the rows' Processor: a page's leases in one statement
        self._dead_unrun = dead_unrun  # OrderedFailurePolicy.dead_unrun
        self._delivery_limit = delivery_limit
        self._renewals = LaneRenewals(store, ttl_ms)
        self._statements = LaneStatements(store, holder, ttl_ms, PAGE_ROWS)  # takes, pages, lets go: many lanes' in one
        self._heads = heads  # due heads of batchable handlers, many lanes' in one transaction
        self._holding: dict[str, asyncio.Task] = {}
        self._waiting: dict[str, None] = {}  # lanes offered while full, in the order offered
        self._armed: dict[str, asyncio.TimerHandle] = {}
        self._stopping = False
        # A lane turned away when full, or a look cut at the free slots: more lanes may wait, so
        # a slot that frees up looks again at once, not at the watchdog's next round.
        self._backlog = False
        self._looking: asyncio.Task | None = None
        self._watched: frozenset[str] = frozenset()  # the watchdog's sources at its last look
        # Sources not ordered here whose lanes still hold rows, as last asked (at `_leftovers_at`), and
        # those of lanes offered here since the question was sent (`_offered`).
        self._leftovers: frozenset[str] = frozenset()
        self._leftovers_at: float | None = None
        self._offered: set[str] = set()

    def held(self) -> int:
        """Lanes held, or being taken (the heartbeat's `keys_held`)."""
        return len(self._holding)

    def holds(self, lane: str) -> bool:
        return lane in self._holding

    def offer(self, lane: str) -> None:
        """Takes `lane` and runs it, unless it is held here already, the runner is full or stopping,
        or its source is unknown here or paused (the watchdog comes back to it)."""
        timer = self._armed.pop(lane, None)
        if timer is not None:
            timer.cancel()
        if self._stopping or lane in self._holding:
            return
        if len(self._holding) >= self._capacity:
            if len(self._waiting) < WAITING_LANES:
                self._waiting[lane] = None
            else:
                self._backlog = True
            return
        if not self._known_and_running(lane):
            return
        self._offered.add(source_and_route(lane)[0])  # the watchdog comes back to it (a retry's delay)
        task = asyncio.create_task(self._hold(lane), name=f"lane-{lane}")
        self._holding[lane] = task
        task.add_done_callback(lambda _: self._freed(lane))

    def _known_and_running(self, lane: str) -> bool:
        """Its source (and route) are in this worker's sources file, and not paused: a lane of a
        route removed from the file waits, seen in `webhook_ordering_waiting_events`, rather
        than being taken and failing on a handler this worker does not have."""
        source_name, route = source_and_route(lane)
        source = self._sources.get(source_name)
        if source is None or source_name in self._paused:
            return False
        return not route or any(each.name == route for each in source.routes)

    def _freed(self, lane: str) -> None:
        self._holding.pop(lane, None)
        while self._waiting and not self._stopping and len(self._holding) < self._capacity:
            waiting = next(iter(self._waiting))
            del self._waiting[waiting]
            self.offer(waiting)
        if (
            self._backlog
            and not self._waiting
            and not self._stopping
            and (self._looking is None or self._looking.done())
        ):
            self._looking = asyncio.create_task(self._look_now(), name="lanes-look-now")

    async def _look_now(self) -> None:
        """Looks until the free slots are armed or nothing more waits (each look one statement)."""
        try:
            while self._backlog and not self._stopping and self._free() > 0:
                if not await self.look():
                    return
        except Exception as exc:  # noqa: BLE001 - Postgres away: the watchdog's next round
            log.info("ordering_watchdog_failed", error=describe(exc))

    def _free(self) -> int:
        return self._capacity - len(self._holding) - len(self._armed)

    # -- the watchdog ---------------------------------------------------------

    async def watch(self, every: float = WATCH_SECONDS) -> None:
        """Each `every` seconds, lanes to take within it get a timer (its wait: Postgres's)."""
        while not self._stopping:
            try:
                await self.look(every)
            except Exception as exc:  # noqa: BLE001 - Postgres away: the next look
                log.info("ordering_watchdog_failed", error=describe(exc))
            await asyncio.sleep(every)

    async def look(self, within: float = WATCH_SECONDS) -> int:
        """One look: how many lanes it armed a timer for."""
        free = self._free()
        if free <= 0:
            self._backlog = True
            return 0
        sources = [name for name in await self._watched_sources() if name not in self._paused]
        if not sources:
            self._backlog = False
            return 0  # no statement: a worker with nothing ordered pays nothing for it
        armed = 0
        routes = [f"{name}#{route.name}" for name in sources for route in self._sources[name].routes]
        runnable = await self._store.runnable(sources, free, within, routes)
        self._backlog = len(runnable) >= free
        for lane, wait in runnable:
            if lane in self._holding or lane in self._armed or self._stopping or not self._known_and_running(lane):
                continue
            delay = wait + random.uniform(0, JITTER_SECONDS)
            self._armed[lane] = asyncio.get_running_loop().call_later(delay, self.offer, lane)
            armed += 1
        return armed

    async def _watched_sources(self) -> frozenset[str]:
        """The sources whose lanes the watchdog looks for: those ordered in this worker's file, and
        of the others (ordering removed from the file: their lanes still drain) those whose lanes
        held rows when last asked — at the first look, then every LEFTOVERS_SECONDS, only when some
        source here is not ordered — or whose lane was offered here since (a lane let go after a
        retry is come back to at its `ready_at`, not a minute later)."""
        ordered = {name for name, source in self._sources.items() if source.ordered}
        now = time.monotonic()
        if len(ordered) < len(self._sources) and (
            self._leftovers_at is None or now - self._leftovers_at >= LEFTOVERS_SECONDS
        ):
            offered, self._offered = self._offered, set()  # those offered from now on join the answer
            try:
                self._leftovers = frozenset(await self._store.sources_with_rows())
            except BaseException:
                self._offered |= offered
                raise
            self._leftovers_at = now
        left = (self._leftovers | self._offered) - ordered
        self._watched = frozenset(ordered | (left & self._sources.keys()))
        return self._watched

    # -- stopping -------------------------------------------------------------

    async def stop(self, grace_seconds: float) -> None:
        """No lane taken from now on; each held lane is let go after its
        running row (within `grace_seconds`, else cancelled and let go)."""
        self._stopping = True
        self._waiting.clear()
        for timer in self._armed.values():
            timer.cancel()
        self._armed.clear()
        tasks = list(self._holding.values())
        if not tasks:
            return
        _, unfinished = await asyncio.wait(tasks, timeout=grace_seconds)
        for task in unfinished:
            task.cancel()
        await asyncio.gather(*unfinished, return_exceptions=True)

    # -- one lane -------------------------------------------------------------

    async def _hold(self, lane: str) -> None:
        source_name, route = source_and_route(lane)
        source = self._sources[source_name]
        sent_at = time.monotonic()
        try:
            taken = await self._statements.take(lane)
        except Exception as exc:  # noqa: BLE001 - Postgres away: the watchdog comes back
            log.info("lane_take_failed", lane=lane, error=describe(exc))
            return
        if taken is None:
            return
        if taken.expired:
            log.info("lane_taken_over", lane=lane)
        token = taken.token
        ttl = self._ttl_ms / 1000
        keeper = Keeper(f"lane {lane}", lambda: self._renewals.extend(lane, token), ttl, sent_at + ttl)
        let_go = False
        try:
            async with kept_alive([keeper]):
                let_go = await self._drain(lane, token, source, route, keeper)
        except Exception:
            log.exception("lane_crashed", lane=lane)
        finally:
            if not let_go:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._store.release(lane, token))

    async def _drain(self, lane: str, token: int, source: Source, route: str, keeper: Keeper) -> bool:
        """Runs the lane's rows until it is idle (True: let go, or no longer ours) or must stop (False)."""
        rule = source.ordering_for(route)
        hold = rule.hold_seconds if rule is not None else 0.0
        skip_stale = rule is not None and rule.stale == "skip"
        size = PAGE_ROWS
        while not self._must_stop(source, keeper):
            page: Page = await self._waiting_out_outages(partial(self._page, lane, token, hold, size))
            if not page.ours:
                return True  # taken by another, or gone: nothing of ours to let go
            if page.due_in is not None and page.due_in > 0:  # held: let go until its hold is over
                return await self._store.release(lane, token, page.due_in) or True
            if page.rows:
                let_go = await self._run_page(lane, token, source, route, page, skip_stale, keeper)
                if let_go is not None:
                    return let_go
            if len(page.rows) < size and not self._must_stop(source, keeper):  # all there was: let go if idle
                idle = await self._waiting_out_outages(lambda: self._statements.release_if_idle(lane, token))
                if idle.released or not idle.ours:
                    return True
                # an insert committed meanwhile: the next page
            size = HOT_PAGE_ROWS if len(page.rows) >= size else PAGE_ROWS
        return False

    async def _page(self, lane: str, token: int, hold: float, size: int) -> Page:
        """The lane's next page: PAGE_ROWS rows in a statement shared with other lanes' pages, or
        a hot lane's `size`, in its own."""
        if size == PAGE_ROWS:
            return await self._statements.page(lane, token, hold)
        return await self._store.page(lane, token, size, hold)

    async def _run_page(
        self, lane: str, token: int, source: Source, route: str, page: Page, skip_stale: bool, keeper: Keeper
    ) -> bool | None:
        """The page's rows in order; None: go on with the next page, else as `_drain`.
        With `pages`, the rows' leases are taken for the whole page in one
        statement (and their completions read in one more), renewed while
        they wait their turn; those not used are given back at the end."""
        messages = [_message(lane, token, row, _is_stale(row, page, skip_stale)) for row in page.rows]
        leases: dict[str, Lease] = {}
        completed: dict[str, str] = {}
        pages = self._pages
        # a lone row's lease and check are shared across lanes instead, as are a batched head's (LaneHeads)
        if pages is not None and len(messages) > 1 and not self._batched(messages[0]):
            keys = list(dict.fromkeys(message.key for message in messages))
            leases, completed = await self._waiting_out_outages(partial(pages.lease_rows, keys))
        waiting = list(leases.values())
        async with contextlib.AsyncExitStack() as keeping:
            if pages is not None and waiting:
                await keeping.enter_async_context(kept_alive([pages.lease_keeper(waiting)]))
                keeping.push_async_callback(self._give_back, waiting)
            for row, message in zip(page.rows, messages):
                if self._must_stop(source, keeper):
                    return False
                lease = leases.pop(message.key, None)
                if lease is not None:
                    waiting.remove(lease)  # its run keeps it from now on
                if self._poisoned(row):
                    if lease is not None:
                        waiting.append(lease)  # not run: given back
                    outcome: Outcome | None = await self._dead_unrun_row(message, row, source)
                else:
                    outcome = await self._run_row(message, keeper, lease, completed.get(message.key))
                let_go = await self._after(outcome, lane, token, row.seq, source, route)
                if let_go is not None:
                    return let_go
        return None

    def _batched(self, message: EventMessage) -> bool:
        """Whether the row goes to `LaneHeads` first (its handler is batchable)."""
        return self._heads is not None and self._heads.takes(message)

    async def _after(
        self, outcome: Outcome | None, lane: str, token: int, seq: int, source: Source, route: str
    ) -> bool | None:
        """What a row's outcome means for its lane: None, go on; else as `_drain`."""
        if outcome is None:
            return False  # the lane was lost while it ran
        if outcome in _GOES_ON or (outcome is Outcome.DEAD and not blocks(source, route)):
            return None
        if outcome in _FINISHED_HERE:
            if await self._waiting_out_outages(partial(self._store.finish, lane, token, seq)):
                return None
            return True
        return False  # a retry, a deferral, a blocking dead letter: let go (again: harmless)

    async def _give_back(self, leases: list[Lease]) -> None:
        if leases and self._pages is not None:
            with contextlib.suppress(Exception):  # best effort: a lease not given back runs out
                await self._pages.release_leases(list(leases))

    async def _waiting_out_outages(self, statement: Callable[[], Awaitable[Any]]) -> Any:
        """A lane statement, sent again once Postgres is back (the worker's outage gate):
        a lane crashed by an outage would let its lease run out, counting a delivery on its head."""
        return await self._until_done(lambda _: statement(), None)

    def _poisoned(self, row: PendingRow) -> bool:
        """A head whose holders died running it more than the delivery limit (take_lane counts them)."""
        return (
            self._dead_unrun is not None and self._delivery_limit is not None and row.deliveries > self._delivery_limit
        )

    async def _dead_unrun_row(self, message: EventMessage, row: PendingRow, source: Source) -> Outcome:
        assert self._dead_unrun is not None and message.ordered is not None
        lane = message.ordered.lane
        message = replace(message, ordered=replace(message.ordered, stale=False))
        started = time.perf_counter()
        error = {
            "attempt": message.attempt,
            "at": datetime.now(UTC).isoformat(),
            "type": "DeliveryLimitExceeded",
            "message": f"its lane's holder died running it more than {self._delivery_limit} times",
        }
        log.error("ordered_row_poisoned", lane=lane, seq=row.seq, deliveries=row.deliveries)
        outcome = await self._dead_unrun(message, source, error)
        self._settled(message, outcome, started)
        return outcome

    def _must_stop(self, source: Source, keeper: Keeper) -> bool:
        return self._stopping or keeper.lost or source.name in self._paused

    async def _run_row(
        self, message: EventMessage, keeper: Keeper, lease: Lease | None = None, completed_sha256: str | None = None
    ) -> Outcome | None:
        """One row through the per-event claim (under its page's lease when
        given; a run again after an outage takes its own), cancelled if the
        lane is lost meanwhile; its outcome (None: cancelled so)."""
        assert message.ordered is not None
        started = time.perf_counter()
        leased = [lease] if lease is not None else []

        async def run(message: EventMessage) -> Outcome:
            lease = leased.pop() if leased else None
            if self._heads is not None and completed_sha256 is None and self._batched(message):
                outcome = await self._heads.run(message, lease)  # raising, it gave the lease back
                if outcome is not None:
                    return outcome
            if lease is not None and self._pages is not None:
                return await self._pages.run_leased(message, lease, completed_sha256)
            return await self._run(message)

        # run in this task, not one of its own: a hot lane's rows wait on each run's latency, and a
        # task's start and end are loop turns on it; the lane lost cancels this task, told apart
        # from other cancellations (a stop past its grace) as lease.cancelled_when_lost tells them
        task = asyncio.current_task()
        assert task is not None
        lost = False

        def cancel() -> None:
            nonlocal lost
            lost = True
            task.cancel()

        unregister = keeper.when_lost(cancel)
        try:
            outcome = await tracing.within(message, self._until_done(run, message))
        except asyncio.CancelledError:
            if not lost or task.uncancel() > 0:
                raise  # someone else cancels us too (a stop past its grace): let it through
            log.warning("lane_lost_row_cancelled", lane=message.ordered.lane, seq=message.ordered.seq)
            return None
        finally:
            unregister()
        if lost:  # the row ended as the lane was lost, before the cancellation reached it
            task.uncancel()
        self._settled(message, outcome, started)
        return outcome


def _is_stale(row: PendingRow, page: Page, skip_stale: bool) -> bool:
    """Older (`by`) than the lane's last processed, under `stale = "skip"`; equal is not stale."""
    return skip_stale and row.by_value is not None and page.last_by is not None and row.by_value < page.last_by


def _message(lane: str, token: int, row: PendingRow, stale: bool) -> EventMessage:
    event: Any = event_of(row.body, row.amqp_headers)
    return replace(
        event,
        attempt=row.attempt,
        errors=row.errors,
        replay_of=row.replay_of,
        deliveries=row.deliveries,
        ordered=OrderedStep(lane=lane, seq=row.seq, token=token, by=row.by_value, stale=stale),
    )
