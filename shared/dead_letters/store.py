"""The dead-letter store: reading dead letters and acting on them (each act
in the audit log, `shared/audit/log.py`, in the act's transaction), and the
console's bulk actions — one object the admin API, the console and
`webhook-ingest dlq` share (docs/reference.md §8).

It talks to Postgres through one asyncpg pool (each call takes a connection
of its own) or one connection (the CLI), with the named SQL of
`shared/dead_letters/queries.sql`. What the rows mean (statuses, errors, the JSON shapes)
is `shared/dead_letters/model.py`; the workers' one write, recording a dead letter,
stays there beside it.

An ordered source's dead letter (docs/design.md, "Ordering keys") is a row
of its lane, kept `dead` and, under `on_dead_letter = "block"`, holding the
lane. Its replay runs it again *in place* (`replay_in_place`: its row
pending again before everything still waiting, the block cleared, nothing
published); its discard deletes the row and frees the lane
(`discard_ordered`). Both run in the act's transaction after the dead
letter's own row is locked (the lock order of shared/ordering/queries.sql),
and wake the lanes they freed once the act is done: through the replay's
channel, or the store's `wake` (the ingress's broker); without one the
workers' watchdog finds the lane within its second.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

import asyncpg
import orjson
from aio_pika.abc import AbstractChannel

from webhook_ingest.shared.archive import store as archive_store
from webhook_ingest.shared.audit import UNKNOWN_ACTOR, Actor, AuditLog, record_audit
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.db import one_of, raise_if_cancelled
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.event import to_amqp
from webhook_ingest.shared.observability import get_logger, metrics, tracing
from webhook_ingest.shared.ordering import discard_ordered, lane_value, replay_in_place
from webhook_ingest.shared.runs import BULK_ACTIONS, Hold, RunBusy, holding, run_lock, waiting_for_run

from .bulk import BulkAction
from .model import (
    SQL,
    STATUSES,
    UNREADABLE,
    ChangedMeanwhile,
    DeadLetterFilter,
    DeadLetterNotFound,
    InvalidStatus,
    NotReplayable,
    Replayed,
    ReplayInterrupted,
    decoded,
    rebuilt_event,
)

log = get_logger(__name__)
REPLAY_PUBLISH_TIMEOUT = 10.0
ACQUIRE_TIMEOUT = 5.0
GAUGE_REFRESH_SECONDS = 15.0

LaneWaker = Callable[[Sequence[str]], Awaitable[None]]  # wakes ordering lanes an act freed; never raises


class DeadLetterStore:
    def __init__(self, database: asyncpg.Pool | asyncpg.Connection, wake: LaneWaker | None = None):
        self._database = database  # a pool (ingress, workers), or the CLI's one connection
        self._wake = wake  # lanes a discard freed (a replay wakes through its own channel); None: the watchdog
        self.audit_log = AuditLog(database)  # where its acts are recorded (also a bulk action's runner's)

    def _connection(self) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]:
        return one_of(self._database, ACQUIRE_TIMEOUT)

    # -- reading ---------------------------------------------------------------

    async def newest_first(
        self, source: str | None = None, status: str = "dead", limit: int | None = None
    ) -> list[dict]:
        """`status` one of STATUSES or "all"; `source` None: every source."""
        async with self._connection() as connection:
            rows = await connection.fetch(SQL["list_dead_letters"], source, _status_filter(status), limit)
        return [decoded(row) for row in rows]

    async def get(self, dead_letter_id: int) -> dict | None:
        async with self._connection() as connection:
            row = await connection.fetchrow(SQL["get_dead_letter"], dead_letter_id)
        return None if row is None else decoded(row)

    async def ordering_block(self, dead_letter_id: int) -> dict | None:
        """The ordering lane the dead letter blocks (`lane`, `value`, `waiting`:
        events behind it, `blocked_since`); None when it blocks none."""
        async with self._connection() as connection:
            row = await connection.fetchrow(SQL["ordering_block"], dead_letter_id)
        return None if row is None else dict(row) | {"value": lane_value(row["lane"])}

    async def count_open(self) -> int:
        async with self._connection() as connection:  # bounded: the workers' gauge shares their pool
            return await connection.fetchval(SQL["count_open_dead_letters"], timeout=ACQUIRE_TIMEOUT)

    async def search(self, where: DeadLetterFilter, before: int | None = None, limit: int | None = 50) -> list[dict]:
        """One page, newest first: rows with ids below `before` (None: the newest)."""
        async with self._connection() as connection:
            rows = await connection.fetch(
                SQL["search_dead_letters"],
                where.source,
                where.status,
                where.error_type,
                where.since,
                where.until,
                where.text,
                before,
                limit,
            )
        return [decoded(row) for row in rows]

    async def matching_open_ids(self, where: DeadLetterFilter) -> list[int]:
        """The open dead letters the filter matches (its status aside), oldest
        first: the set a bulk action freezes."""
        open_ones = DeadLetterFilter(where.source, "dead", where.error_type, where.since, where.until, where.text)
        return [row["id"] for row in reversed(await self.search(open_ones, limit=None))]

    async def filter_choices(self) -> tuple[list[str], list[str]]:
        """Every source and last error type the table holds."""
        async with self._connection() as connection:
            row = await connection.fetchrow(SQL["dead_letter_choices"])
        return list(row["sources"]), list(row["error_types"])

    async def replays_of(self, dead_letter_id: int) -> list[dict]:
        """Every replay of the dead letter, oldest first: when, who, which bulk action."""
        async with self._connection() as connection:
            return [dict(row) for row in await connection.fetch(SQL["replays_of"], dead_letter_id)]

    async def overview(self) -> tuple[dict[str, int], int, int | None]:
        """The console's overview from Postgres: outcomes in the last hour,
        open dead letters, the outbox's backlog (None: no outbox table)."""
        async with self._connection() as connection:
            outcomes = dict(await connection.fetchrow(SQL["outcomes_last_hour"]))
            open_count = await connection.fetchval(SQL["count_open_dead_letters"])
            has_outbox = await connection.fetchval(SQL["outbox_exists"])
            outbox = await connection.fetchval(SQL["count_outbox"]) if has_outbox else None
        return outcomes, open_count, outbox

    async def keep_open_gauge(self, every: float = GAUGE_REFRESH_SECONDS) -> None:
        """Forever (the ingress and each worker run it): `webhook_dead_letters_open`
        follows the table; a Postgres outage leaves it stale, logged, never a dead task."""
        while True:
            try:
                metrics.dead_letters_open.set(await self.count_open())
            except Exception as exc:  # noqa: BLE001 - a stale gauge, never a dead task
                raise_if_cancelled()
                log.warning("dead_letters_gauge_stale", error=describe(exc))
            await asyncio.sleep(every)

    # -- acting ----------------------------------------------------------------

    async def discard(self, ids: Sequence[int], actor: Actor = UNKNOWN_ACTOR) -> list[int]:
        """Marks them discarded (kept for audit); all or nothing: an unknown id
        raises DeadLetterNotFound and changes nothing."""
        async with self._connection() as connection, connection.transaction():
            discarded = await connection.fetch(SQL["set_dead_letter_status"], list(ids), "discarded")
            _require_all_found(ids, discarded)
            await connection.execute(SQL["forget_handed_on"], list(ids))
            await archive_store.discarded(connection, list(ids))
            freed = await discard_ordered(connection, sorted(ids))
            await record_audit(connection, actor, "discard", [row["id"] for row in discarded])
        await self._wake_freed(freed)
        return [row["id"] for row in discarded]

    async def replay_if_open(
        self,
        channel: AbstractChannel,
        namespace: str,
        dead_letter_id: int,
        actor: Actor,
        bulk_action_id: int | None = None,
        held: asyncpg.Connection | None = None,
    ) -> None:
        """Replay one dead letter only while it is still open: the console's
        button, and each step of a bulk replay. Its row stays locked from the
        check to the commit, so two people clicking at once replay it once; the
        second gets ChangedMeanwhile. A single replay is audited here, a bulk
        one by its caller, once for the whole set. `held`: a bulk runner's
        session holding its action (`_acting`). An ordered dead letter is
        replayed in place, nothing published, and its lane woken after."""
        async with self._acting(held) as connection:
            row = await _lock_open(connection, dead_letter_id)
            if row["last_error_type"] == UNREADABLE:
                raise NotReplayable([dead_letter_id])
            # Marked before the publish: a new failure of the replayed event
            # waits for this commit, then records a new open row (insert_dead_letter).
            replay_id = await _mark_replayed(connection, row, actor, bulk_action_id)
            if replay_id is None:  # cannot happen while we hold the row; said, not assumed
                raise ChangedMeanwhile(dead_letter_id, "changed")
            lane = await replay_in_place(connection, dead_letter_id, replay_id)  # an ordered one: in place
            if lane is None:
                try:
                    await _publish(channel, namespace, row, replay_id)
                except Exception as exc:  # any broker failure: nothing was replayed
                    raise ReplayInterrupted([], exc) from exc
            if bulk_action_id is None:
                await record_audit(connection, actor, "replay", [dead_letter_id])
        if lane is not None:  # a bulk runner's savepoint commits with its step: the watchdog covers a wake too early
            await wake_lanes(channel, namespace, [lane])

    async def discard_if_open(
        self,
        dead_letter_id: int,
        actor: Actor,
        bulk_action_id: int | None = None,
        held: asyncpg.Connection | None = None,
    ) -> None:
        """Discard one dead letter only while it is still open (see replay_if_open)."""
        async with self._acting(held) as connection:
            await _lock_open(connection, dead_letter_id)
            await connection.execute(SQL["set_dead_letter_status"], [dead_letter_id], "discarded")
            await connection.execute(SQL["forget_handed_on"], [dead_letter_id])
            await archive_store.discarded(connection, [dead_letter_id])
            freed = await discard_ordered(connection, [dead_letter_id])
            if bulk_action_id is None:
                await record_audit(connection, actor, "discard", [dead_letter_id])
        await self._wake_freed(freed)

    async def _wake_freed(self, lanes: Sequence[str]) -> None:
        if lanes and self._wake is not None:
            await self._wake(lanes)

    @contextlib.asynccontextmanager
    async def _acting(self, held: asyncpg.Connection | None) -> AsyncIterator[asyncpg.Connection]:
        """One act's transaction: of a connection of its own, or with `held`, a
        savepoint of the transaction in which a bulk runner holds its action
        (`run_locks.holding`), committed with the dead letter's step. There
        the act is under the hold's statement limit, and a session the server
        ended meanwhile (idle past it) fails the act before anything is
        written or published: on another connection it was answered, and
        committed, after a Cancel took the action and returned. A runner
        killed mid-act leaves nothing of it written."""
        if held is not None:
            async with _savepoint(held, "bulk_act"):
                yield held
            return
        async with self._connection() as connection, connection.transaction():
            yield connection

    async def replay(
        self,
        channel: AbstractChannel,
        namespace: str,
        ids: Sequence[int] | None = None,
        all_: bool = False,
        source: str | None = None,
        actor: Actor = UNKNOWN_ACTOR,
    ) -> Replayed:
        """Publish dead letters back to the events queue with a fresh attempt
        budget: the given `ids`, or with `all_` every open one (of `source`).
        Unknown ids raise DeadLetterNotFound before anything is published.

        Each row is replayed only as this call read it (`claim_for_replay`):
        one that another replay or a discard changed since — two operators at
        once, the CLI beside the console — is skipped, not published again.

        `channel` must be in confirm mode: a row is marked replayed in the
        transaction that publishes it, committed after the broker's confirm. A
        crash between the two leaves it `dead` though it was published;
        replaying it again publishes a second copy, which the workers'
        idempotency (same key, same payload) makes a harmless duplicate.
        """
        async with self._connection() as connection:
            rows = await connection.fetch(SQL["dead_letters_to_replay"], list(ids or ()), all_, source)
            _require_all_found(ids or (), rows)
            done = Replayed([], [])
            try:
                for row in _replayable(rows, refuse=not all_):
                    replayed = await _replay_as_read(connection, channel, namespace, row, actor, done)
                    (done.replayed if replayed else done.skipped).append(row["id"])
            finally:
                if done.replayed:  # also what a replay that stopped half way did
                    await record_audit(
                        connection, actor, "replay", done.replayed, {"skipped": done.skipped} if done.skipped else None
                    )
        return done

    # -- bulk actions (shared/dead_letters/bulk.py) ---------------------------------

    async def prepare_bulk(self, action: str, ids: Sequence[int], described: dict, actor: Actor) -> int:
        """A new bulk action over exactly `ids`, waiting for its confirmation;
        `described`: what chose them (a filter's `as_json()`, an incident)."""
        async with self._connection() as connection:
            return await connection.fetchval(
                SQL["insert_bulk_action"], action, list(ids), orjson.dumps(described).decode(), str(actor)
            )

    async def bulk_action(self, bulk_action_id: int) -> BulkAction | None:
        async with self._connection() as connection:
            row = await connection.fetchrow(SQL["get_bulk_action"], bulk_action_id)
        return None if row is None else BulkAction.from_row(row)

    async def claim_bulk(self, bulk_action_id: int, rate: float) -> BulkAction | None:
        """Running at `rate` per second, if it was waiting (prepared, or failed
        half way); None when it runs already, finished or was cancelled."""
        async with self._connection() as connection:
            try:
                row = await waiting_for_run(
                    connection, run_lock(BULK_ACTIONS, bulk_action_id), SQL["claim_bulk_action"], bulk_action_id, rate
                )
            except RunBusy:
                return None  # a runner is in the middle of a dead letter: it runs
        return None if row is None else BulkAction.from_row(row)

    async def finish_bulk(self, bulk_action_id: int, state: str, error: str | None = None) -> None:
        async with self._connection() as connection:
            await connection.execute(SQL["finish_bulk_action"], bulk_action_id, state, error)

    async def cancel_bulk(self, bulk_action_id: int, actor: Actor | None = None) -> bool:
        """Cancelled (what was done stays done); False when it had ended. Waits
        for the dead letter in flight, so that nothing is acted on after this
        returns; RunBusy when a runner held it past `run_locks.WAIT_SECONDS`.
        A dead letter its runner marked in flight and never stepped (it died
        mid-act) is, of a replay, counted done and `in_doubt`; of a discard,
        done only if discarded and by no one else's discard. Audited `bulk_ACTION_cancelled`
        under `actor`, with the ids counted done: a runner that died wrote no
        end entry, and this one is then the log's only word of what it did."""
        async with self._connection() as connection:
            cancelled = (
                await waiting_for_run(
                    connection,
                    run_lock(BULK_ACTIONS, bulk_action_id),
                    SQL["cancel_bulk_action"],
                    bulk_action_id,
                    settled=SQL["bulk_action_act_settled"],
                )
                is not None
            )
        if cancelled and actor is not None:
            action = await self.bulk_action(bulk_action_id)
            assert action is not None
            await self.audit_log.record(
                actor,
                f"bulk_{action.action}_cancelled",
                action.done,
                {"bulk_action_id": bulk_action_id, "skipped": len(action.skipped), "in_doubt": action.in_doubt},
            )
        return cancelled

    @contextlib.asynccontextmanager
    async def held_bulk(self, bulk_action_id: int) -> AsyncIterator["HeldBulk"]:
        """The bulk action's row locked for one dead letter by its runner, with its state."""
        lock = run_lock(BULK_ACTIONS, bulk_action_id)
        async with self._connection() as connection, holding(connection, lock) as hold:
            row = await connection.fetchrow(SQL["lock_bulk_action"], bulk_action_id)
            yield HeldBulk(
                hold, bulk_action_id, None if row is None else row["state"], None if row is None else row["orphaned"]
            )


@dataclass(frozen=True)
class HeldBulk:
    """A bulk action's row as its runner holds it for one dead letter (`DeadLetterStore.held_bulk`)."""

    hold: Hold
    bulk_action_id: int
    state: str | None
    orphaned: int | None  # the dead letter in flight when a runner before this one died (or its act failed)

    async def in_flight(self, dead_letter_id: int) -> str | None:
        """ "`dead_letter_id` in flight" committed, the action still held: before
        acting on it. Its state as read again (`HeldReplay.in_flight`'s why)."""
        await self.hold.in_flight(SQL["bulk_action_in_flight"], self.bulk_action_id, dead_letter_id)
        return await self.hold.connection.fetchval(SQL["lock_bulk_action"], self.bulk_action_id)

    async def step(self, dead_letter_id: int, acted: bool) -> None:
        await self.hold.connection.execute(SQL["bulk_action_step"], self.bulk_action_id, dead_letter_id, acted)

    async def acted_apart(self, dead_letter_id: int, action: str) -> bool:
        """Whether the dead letter in flight when a runner before died, no
        longer open now, was acted on by that runner (the previous release's,
        which committed its act apart from its step), not by someone else."""
        return await self.hold.connection.fetchval(
            SQL["bulk_action_acted_apart"], self.bulk_action_id, dead_letter_id, action
        )


async def _replay_as_read(
    connection: asyncpg.Connection,
    channel: AbstractChannel,
    namespace: str,
    row: asyncpg.Record,
    actor: Actor,
    done: Replayed,
) -> bool:
    """Publishes `row` in the transaction that marks it replayed; False,
    nothing published, when the row changed since it was read, or its event
    waits in its ordering lane already (an earlier replay's, not run yet)."""
    try:
        async with connection.transaction():
            replay_id = await _mark_replayed(connection, row, actor)
            if replay_id is None:
                return False
            # An ordered dead letter's row pending again in its lane, nothing
            # published: its lane is woken once this commits.
            lane = await replay_in_place(connection, row["id"], replay_id)
            if lane is None and await connection.fetchval(SQL["waiting_in_a_lane"], row["source"], row["key"]):
                raise _InItsLane
            if lane is None:
                try:
                    await _publish(channel, namespace, row, replay_id)
                except Exception as exc:  # any broker failure: report what was done
                    raise ReplayInterrupted(done.replayed, exc) from exc
    except _InItsLane:  # rolled back: not marked replayed again
        return False
    if lane is not None:
        await wake_lanes(channel, namespace, [lane])
    return True


async def wake_lanes(channel: AbstractChannel | None, namespace: str, lanes: Sequence[str]) -> None:
    """A wake-up for each lane an act freed; one not sent (no broker, no
    `NS.ordering` yet) is logged: the workers' watchdog finds the lane
    within its second anyway."""
    for lane in lanes:
        try:
            if channel is None:
                raise ConnectionError("no broker channel")
            await topology.publish_wake(channel, namespace, lane)
        except Exception as exc:  # noqa: BLE001 - a hint lost, never the act's failure
            raise_if_cancelled()
            log.info("ordering_wake_not_sent", lane=lane, error=describe(exc))


class _InItsLane(Exception):
    """The event waits in its ordering lane already: nothing to replay."""


async def _mark_replayed(
    connection: asyncpg.Connection, row: asyncpg.Record, actor: Actor, bulk_action_id: int | None = None
) -> int | None:
    """Status `replayed`, and one more entry in its replay history, whose id
    names the new retry chain: every replay is one, also of a dead letter
    replayed before (workers/claim/attempts.py). None, nothing changed, when the
    row is no longer the version `row` was read as (claim_for_replay)."""
    async with _savepoint(connection, "mark_replayed"):
        if await connection.fetchval(SQL["claim_for_replay"], row["id"], row["version"]) is None:
            return None
        replay_id = await connection.fetchval(SQL["insert_replay"], row["id"], str(actor), bulk_action_id)
        await archive_store.replayed(connection, row["id"], replay_id)
        return replay_id


@contextlib.asynccontextmanager
async def _savepoint(connection: asyncpg.Connection, name: str) -> AsyncIterator[None]:
    """A subtransaction of the connection's transaction, by hand: asyncpg's
    `connection.transaction()` refuses to nest in one begun by hand (a bulk
    runner's held session). Undone on an error, which goes on; a session
    gone meanwhile fails the rollback too, and the error goes on as it was."""
    await connection.execute(f"SAVEPOINT {name}")
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):  # the transaction's end undoes it then
            await connection.execute(f"ROLLBACK TO SAVEPOINT {name}; RELEASE SAVEPOINT {name}")
        raise
    await connection.execute(f"RELEASE SAVEPOINT {name}")


async def _publish(channel: AbstractChannel, namespace: str, row: asyncpg.Record, replay_id: int) -> None:
    """The replayed event, in a trace of its own linked to its last attempt's
    (docs/design.md, "Traces"): its publish's span is that trace's first child."""
    with tracing.replaying(row, replay_id):
        event = rebuilt_event(row, replay_id)
        await topology.publish(
            channel,
            to_amqp(event),
            topology.events_queue_for(namespace, event.key),
            timeout=REPLAY_PUBLISH_TIMEOUT,
        )


async def _lock_open(connection: asyncpg.Connection, dead_letter_id: int) -> asyncpg.Record:
    row = await connection.fetchrow(SQL["lock_dead_letter"], dead_letter_id)
    if row is None:
        raise DeadLetterNotFound([dead_letter_id])
    if row["status"] != "dead":
        raise ChangedMeanwhile(dead_letter_id, row["status"])
    return row


def _status_filter(status: str) -> str | None:
    if status == "all":
        return None
    if status not in STATUSES:
        raise InvalidStatus(f"unknown status {status!r} (one of {', '.join(STATUSES)}, all)")
    return status


def _replayable(rows: Sequence[asyncpg.Record], refuse: bool) -> list[asyncpg.Record]:
    """Rows that are events; the others raise NotReplayable when `refuse`
    (explicit ids), else are left dead (`--all`)."""
    unreadable = [row["id"] for row in rows if row["last_error_type"] == UNREADABLE]
    if unreadable and refuse:
        raise NotReplayable(unreadable)
    return [row for row in rows if row["last_error_type"] != UNREADABLE]


def _require_all_found(ids: Iterable[int], rows: Iterable[asyncpg.Record]) -> None:
    missing = set(ids) - {row["id"] for row in rows}
    if missing:
        raise DeadLetterNotFound(missing)
