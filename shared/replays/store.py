"""Replays of archived events in Postgres (`shared/replays/model.py` says what
they are): the dry-run count, the frozen selection, the progress, and the
job `shared/runs/paced.py` drives — one object the admin API, the console
and `webhook-ingest events replay` share.

Over one asyncpg pool (the ingress) or one connection (the CLI), with the
named SQL of `shared/replays/queries.sql`.
"""

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import asyncpg
from aio_pika.abc import AbstractChannel

from webhook_ingest.shared.archive import NO_ROUTES, EventFilter, SourceRoutes
from webhook_ingest.shared.audit import Actor, AuditLog
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.db import jsonb, load_queries, one_of
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.event import to_amqp
from webhook_ingest.shared.observability import get_logger, tracing
from webhook_ingest.shared.ordering import insert_ordered
from webhook_ingest.shared.runs import (
    DEFAULT_RATE,
    EVENT_REPLAYS,
    TAKEN_OVER,
    Hold,
    RunBusy,
    holding,
    run_lock,
    waiting_for_run,
)
from webhook_ingest.shared.sources import Source

from .model import EventReplay, ReplayItem, filter_json, ordered_parts, replayed_message

log = get_logger(__name__)

SQL = load_queries("webhook_ingest.shared.replays", fragments_from=["webhook_ingest.shared.archive"])

ACQUIRE_TIMEOUT = 5.0
STATEMENT_SECONDS = 60.0  # freezing a large window reads it whole
PUBLISH_TIMEOUT = 10.0
ITEMS_PER_READ = 500
PRUNE_SECONDS = 10.0  # one statement of the items' pruning (archive_upkeep.PRUNE_PAGE items: ~0.1 s)


class EventReplayStore:
    def __init__(self, database: asyncpg.Pool | asyncpg.Connection):
        self._database = database
        self.audit_log = AuditLog(database)  # where its starts, ends and cancels are recorded

    def _connection(self) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]:
        return one_of(self._database, ACQUIRE_TIMEOUT)

    async def count(self, where: EventFilter, routes: SourceRoutes = NO_ROUTES) -> int:
        """How many events a replay of `where` would take now (the dry run);
        `routes`, the sources file's, tell a routed event `processing`
        (`ArchiveStore.search`)."""
        async with self._connection() as connection:
            return await connection.fetchval(
                SQL["count_event_replay"], *where.arguments(), *routes.arguments(), timeout=STATEMENT_SECONDS
            )

    async def prepare(self, where: EventFilter, actor: Actor, routes: SourceRoutes = NO_ROUTES) -> EventReplay:
        """A replay of what `where` matches now, frozen, waiting to be started
        (`routes` as `count`'s)."""
        async with self._connection() as connection:
            replay_id = await connection.fetchval(
                SQL["insert_event_replay"],
                *where.arguments(),
                str(actor),
                jsonb(filter_json(where)),
                *routes.arguments(),
                timeout=STATEMENT_SECONDS,
            )
            return EventReplay.from_row(await connection.fetchrow(SQL["get_event_replay"], replay_id))

    async def get(self, replay_id: int) -> EventReplay | None:
        async with self._connection() as connection:
            row = await connection.fetchrow(SQL["get_event_replay"], replay_id)
        return None if row is None else EventReplay.from_row(row)

    async def replays_of(self, key: str, routes: Sequence[str] = (), limit: int = 20) -> list[dict]:
        """The replays by selection that took the event keyed `key`, newest first
        (an event's page): `id`, `state`, `created_by`, `created_at`, `handled`,
        `completions` (each of `routes`, its source's route names, with the
        completion time of its run, `replay-R/KEY#ROUTE`, or None; {} without
        routes) and `completed_at`: its run's completion (`replay-R/KEY`), or
        for a routed event the latest of its routes' once every one completed;
        None before."""
        async with self._connection() as connection:
            rows = await connection.fetch(SQL["replays_of_event"], key, limit, list(routes))
        listed = []
        for row in rows:
            replay = dict(row)
            replay["completions"] = dict(zip(routes, replay.pop("route_completed_at"), strict=True))
            times = list(replay["completions"].values())
            if replay["completed_at"] is None and times and None not in times:
                replay["completed_at"] = max(times)
            listed.append(replay)
        return listed

    async def claim(self, replay_id: int, rate: float = DEFAULT_RATE) -> EventReplay | None:
        """Running at `rate` per second, by the caller alone; None when it runs
        elsewhere (and has not stalled), is finished, or was cancelled. Waits
        for an item in flight (`shared/runs/locks.py`)."""
        async with self._connection() as connection:
            try:
                row = await waiting_for_run(
                    connection, run_lock(EVENT_REPLAYS, replay_id), SQL["claim_event_replay"], replay_id, rate
                )
            except RunBusy:
                return None  # a runner is in the middle of an item: it runs
        return None if row is None else EventReplay.from_row(row)

    async def cancel(self, replay_id: int, actor: Actor | None = None) -> bool:
        """Cancelled (what was published stays published); False when it had ended.
        Waits for the item in flight, so that nothing is published after this
        returns; RunBusy when a runner held it past `run_locks.WAIT_SECONDS`.
        An item its runner marked in flight and never stepped (it died
        mid-publish) is counted published and `in_doubt`. Audited
        `events_replay_cancelled` under `actor`, with what it reports."""
        async with self._connection() as connection:
            row = await waiting_for_run(
                connection, run_lock(EVENT_REPLAYS, replay_id), SQL["cancel_event_replay"], replay_id
            )
        if row is None:
            return False
        if actor is not None:
            cancelled = await self.get(replay_id)
            assert cancelled is not None
            await self.audit_log.record(
                actor,
                "events_replay_cancelled",
                (),
                {
                    "event_replay_id": replay_id,
                    "handled": cancelled.handled,
                    "published": cancelled.published,
                    "skipped": cancelled.skipped,
                    "in_doubt": int(cancelled.in_doubt),
                },
            )
        return True

    @contextlib.asynccontextmanager
    async def held(self, replay_id: int, stepped_at: datetime | None) -> AsyncIterator["HeldReplay"]:
        """The replay's row locked for one item by the runner whose last step
        (or claim) was at `stepped_at`, with its state as that runner sees it:
        `taken_over` when another runner claimed it since (a cancel leaves
        stepped_at as it was)."""
        async with self._connection() as connection, holding(connection, run_lock(EVENT_REPLAYS, replay_id)) as hold:
            row = await connection.fetchrow(SQL["lock_event_replay"], replay_id)
            yield HeldReplay(hold, replay_id, _seen(row, stepped_at), row is not None and row["orphaned"], stepped_at)

    async def items(self, replay_id: int, first: int) -> AsyncIterator[ReplayItem]:
        """The frozen items from `first` on, in order, read a page at a time."""
        while True:
            async with self._connection() as connection:
                rows = await connection.fetch(SQL["event_replay_items"], replay_id, first, ITEMS_PER_READ)
            for row in rows:
                yield ReplayItem(**dict(row))
            if len(rows) < ITEMS_PER_READ:
                return
            first = rows[-1]["item"] + 1

    async def to_prune(self, ended_seconds: float, limit: int, again_seconds: float) -> list[int]:
        """The replays, oldest first, at most `limit`, that ended (`done`,
        `cancelled`) more than `ended_seconds` ago with items left that a
        pass of `prune` has still to read: none begun, one under way, or one
        over that began more than `again_seconds` ago (`shared/upkeep.py`)."""
        async with self._connection() as connection:
            rows = await connection.fetch(
                SQL["event_replays_to_prune"], ended_seconds, limit, again_seconds, timeout=PRUNE_SECONDS
            )
        return [row["id"] for row in rows]

    async def prune(self, replay_id: int, ended_seconds: float, limit: int, again_seconds: float) -> tuple[int, bool]:
        """One statement: if the replay ended more than `ended_seconds` ago,
        the next `limit` items of its pass (from where the last statement
        left it; from the first item left when none has begun, or when the
        last is over and began more than `again_seconds` ago), those whose
        event has no arrival archived (its page is gone) deleted, the others
        skipped, and the pass moved past them; items another process is
        reading meanwhile are left to it. (Items deleted, whether the pass
        may have more: as many were read as asked.) The replay's row, its
        progress, stays."""
        async with self._connection() as connection:
            row = await connection.fetchrow(
                SQL["prune_event_replay_items"], replay_id, ended_seconds, limit, again_seconds, timeout=PRUNE_SECONDS
            )
        return row["deleted"], row["read"] == limit

    async def publish(
        self,
        channel: AbstractChannel,
        namespace: str,
        replay_id: int,
        item: ReplayItem,
        held: asyncpg.Connection | None = None,
        sources: Mapping[str, Source] | None = None,
        woken: list[str] | None = None,
    ) -> bool:
        """Item's event published under the replay's key, confirmed by the
        broker; False, nothing published, when its arrival is no longer
        archived (its day dropped by the retention meanwhile). `held`: the
        runner's session holding the run, which reads the arrival: a read
        slower than the hold fails on its statement limit, or on the session
        the server ended meanwhile, before any publish; on another session it
        could be answered after a Cancel took the run and returned.

        An ordered source's event (`sources`, the sources file's) is instead
        appended to its live lanes in `held`'s transaction, which commits it
        with the item's step: once per replay, in selection order. The lanes
        it woke (idle -> busy) are added to `woken`, to wake once that commits."""
        async with contextlib.nullcontext(held) if held is not None else self._connection() as connection:
            arrival = await connection.fetchrow(SQL["event_replay_arrival"], item.source, item.key, item.received_at)
            if arrival is None or arrival["body"] is None:
                return False
            message = replayed_message(arrival, replay_id)
            rows, to_publish = ordered_parts(None if sources is None else sources.get(message.source), message)
            if rows:
                accepted = await insert_ordered(connection, rows)
                if woken is not None:
                    woken.extend(place.lane for place in accepted if place.woke)
        if to_publish is not None:
            with tracing.replaying_selection(message.source, message.key, replay_id):  # its own trace, when traced
                await topology.publish(
                    channel,
                    to_amqp(to_publish),
                    topology.events_queue_for(namespace, to_publish.key),
                    timeout=PUBLISH_TIMEOUT,
                )
        return True

    async def ordered_sources(self, sources: Sequence[str] | None) -> list[str]:
        """Of `sources` (None: every source), those with ordering lanes in Postgres."""
        async with self._connection() as connection:
            rows = await connection.fetch(SQL["sources_with_lanes"], None if sources is None else list(sources))
        return [row["source"] for row in rows]

    async def finish(self, replay_id: int, state: str, error: str | None, stepped_at: datetime | None) -> None:
        async with self._connection() as connection:
            await connection.execute(SQL["finish_event_replay"], replay_id, state, error, stepped_at)


@dataclass(frozen=True)
class HeldReplay:
    """A replay's row as its runner holds it for one item (`EventReplayStore.held`)."""

    hold: Hold
    replay_id: int
    state: str | None
    orphaned: bool  # the item was in flight when a runner before this one died (or its publish failed)

    stepped_at: datetime | None  # the runner's last step (or claim): whose run it is

    async def in_flight(self, item: int) -> str | None:
        """ "Item `item` in flight" committed, the replay still held: before its
        publish. The state as read again once the row is taken again: a writer
        of the row that does not take the run's lock (the previous release's
        Cancel, during an upgrade) may have written it at the mark's commit."""
        await self.hold.in_flight(SQL["event_replay_in_flight"], self.replay_id, item)
        return _seen(await self.hold.connection.fetchrow(SQL["lock_event_replay"], self.replay_id), self.stepped_at)

    async def step(self, item: int, published: bool, stepped_at: datetime | None) -> datetime | None:
        """The step's time, the runner's next `stepped_at`; None when the run is not this runner's."""
        return await self.hold.connection.fetchval(
            SQL["event_replay_step"], self.replay_id, item, published, stepped_at
        )

    async def doubted(self) -> None:
        """The replay counts an item published that may not have gone out (in the step's transaction)."""
        await self.hold.connection.execute(SQL["event_replay_doubted"], self.replay_id)


class EventReplayJob:
    """One claimed replay, as `shared/runs/paced.run` drives it. `channel()`
    gives the confirm-mode channel to publish on (the ingress's publisher's,
    or the CLI's own); `progress` is told after each item (the CLI prints)."""

    name = "events_replay"
    undone_without_its_step = False  # a publish goes out whether or not its step commits

    def __init__(
        self,
        replay: EventReplay,
        actor: Actor,
        store: EventReplayStore,
        channel: Callable[[], AbstractChannel],
        namespace: str,
        progress: Callable[[int, int, int, int], None] | None = None,
        sources: Mapping[str, Source] | None = None,
    ) -> None:
        self.replay, self.actor = replay, actor
        self._sources = sources  # an ordered source's items go to their lanes (`EventReplayStore.publish`)
        self._woken: list[str] = []  # lanes an item woke, to wake once its step committed
        self.id, self.rate = replay.id, replay.rate or DEFAULT_RATE
        self._store, self._channel, self._namespace, self._progress = store, channel, namespace, progress
        self._published, self._skipped = replay.published, replay.skipped
        self._doubted = 0  # items this runner counted published though it did not publish them (`step`)
        self._stepped_at = replay.stepped_at  # the claim's: whose run it is (a stalled run may be claimed again)
        self._held: HeldReplay | None = None  # the row, while an item is in flight

    def remaining(self) -> AsyncIterator[ReplayItem]:
        return self._store.items(self.id, self.replay.next_item)

    @contextlib.asynccontextmanager
    async def holding(self) -> AsyncIterator[str | None]:
        async with self._store.held(self.id, self._stepped_at) as held:
            self._held = held
            try:
                yield held.state
            finally:
                self._held = None
        woken, self._woken = self._woken, []
        await self._wake(woken)

    async def _wake(self, lanes: Sequence[str]) -> None:
        """Wake-ups of lanes an item's insert made busy, now committed; one not
        sent only waits for the workers' watchdog (its next second)."""
        for lane in lanes:
            try:
                await topology.publish_wake(self._channel(), self._namespace, lane)
            except Exception as exc:  # noqa: BLE001 - a hint lost, never the item's failure
                log.info("ordering_wake_not_sent", lane=lane, error=describe(exc))

    async def in_flight(self, item: ReplayItem) -> str | None:
        assert self._held is not None, "an item is marked in flight while the row is held"
        return await self._held.in_flight(item.item)

    async def act(self, item: ReplayItem) -> bool:
        assert self._held is not None, "an item is published while the row is held"
        return await self._store.publish(
            self._channel(), self._namespace, self.id, item, self._held.hold.connection, self._sources, self._woken
        )

    async def step(self, item: ReplayItem, acted: bool) -> None:
        assert self._held is not None, "a step is written while the row is held"
        # Skipped now (its arrival gone) but in flight when a runner before died: that one may have sent it.
        published = acted or self._held.orphaned
        stepped_at = await self._held.step(item.item, published, self._stepped_at)
        if stepped_at is None:  # claimed again elsewhere meanwhile: the next state() says so
            return
        if published and not acted:
            await self._held.doubted()
            self._doubted += 1
        self._stepped_at = stepped_at
        self._published, self._skipped = self._published + published, self._skipped + (not published)
        if self._progress is not None:
            self._progress(item.item, self.replay.total, self._published, self._skipped)

    async def finish(self, state: str, error: str | None) -> None:
        await self._store.finish(self.id, state, error, self._stepped_at)

    async def audit(self, what: str, acted: list[ReplayItem] | None, **detail: object) -> None:
        counts = (
            {"total": self.replay.total, "from_item": self.replay.next_item}
            if acted is None
            else {
                "published": len(acted),
                "published_in_all": self._published,
                "skipped": self._skipped,
                "in_doubt": self._doubted,
            }
        )
        await self._store.audit_log.record(
            self.actor,
            what,
            (),
            {"event_replay_id": self.id, "rate": self.rate, "filter": self.replay.filter} | counts | detail,
        )


def _seen(row: asyncpg.Record | None, stepped_at: datetime | None) -> str | None:
    """The replay's state as the runner whose last step was at `stepped_at` sees it (`EventReplayStore.held`)."""
    return None if row is None else TAKEN_OVER if row["stepped_at"] != stepped_at else row["state"]
