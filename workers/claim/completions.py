"""The workers' Postgres: one store for a key's fence (its lease and fencing
token, its last attempt handed on), its turn, its completion, its conflicts,
and their retention (docs/design.md, "Exclusion").

Every statement is a named block of `workers/queries.sql`. A method that
belongs to the handler's transaction takes that transaction's connection
(the turn, the completion row); the others take a pooled connection of
their own for one short statement. Three pools, so that nothing short
waits behind something long: handlers' transactions (`session()`, held
while a handler that uses `ctx.db` runs), short statements (`statement()`:
leases, completion checks, a completion of its own, dead letters), and
lease renewals. The CLI's `prune` hands it its one connection instead.

`tests/support/in_memory.py` is the same interface without Postgres, for
the processor's unit tests.
"""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

import asyncpg

from webhook_ingest.shared.archive import ArchiveStore
from webhook_ingest.shared.backoff import pauses
from webhook_ingest.shared.db import closed_if_left_by, load_queries
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.event import EventMessage
from webhook_ingest.shared.observability import get_logger
from webhook_ingest.workers.failures import POSTGRES_LOST

from .attempts import HandedOn
from .lease import Lease

log = get_logger(__name__)
SQL = load_queries("webhook_ingest.workers")
PRUNE_BATCH = 5000
# A statement of ours that timed out closes its session: the server may be
# gone without a word (a failover that drops the old primary's traffic, a
# partition past the server's keepalives), and asyncpg's cancellation, and a
# pool's release after it, would wait for its answer for ever
# (docs/design.md, "Sessions a silent server cannot hold").
TIMED_OUT = (asyncio.TimeoutError,)
# Our own statements outside a handler's transaction (whose statements the
# lease timer bounds) are answered within this, or their session is closed.
STATEMENT_SECONDS = 5.0
PROBE_SECONDS = 2.0
# A shared autocommit statement (many runs' leases, renewals, releases or
# completions) that Postgres ended as a deadlock's victim or for a
# serialization failure rolled back whole: it is sent again, a few times,
# rather than failing every run in it. Ours lock fence rows in key order
# and do not deadlock among themselves (queries.sql, extend_leases).
LOCK_CONFLICTS = (asyncpg.DeadlockDetectedError, asyncpg.SerializationError)
STATEMENT_TRIES = 3


class Settled(NamedTuple):
    """What a redelivered message's earlier delivery left: a completion of its own, an open dead letter."""

    completed: bool
    dead: bool


class CompletionStore:
    def __init__(
        self,
        database: asyncpg.Pool | asyncpg.Connection,
        renewals: asyncpg.Pool | None = None,
        transactions: asyncpg.Pool | None = None,
    ):
        self._database = database  # short statements: the workers' pool, or the CLI's one connection
        self._renewals = renewals or database
        self._transactions = transactions or database

    @contextlib.asynccontextmanager
    async def _connection(
        self, database: asyncpg.Pool | asyncpg.Connection | None = None, timeout: float | None = None
    ) -> AsyncIterator[asyncpg.Connection]:
        database = self._database if database is None else database
        if isinstance(database, asyncpg.Pool):
            async with database.acquire(timeout=timeout) as connection:
                yield connection
        else:
            yield database

    def session(self) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]:
        """A pooled connection for a handler's transaction (`ctx.db`, a batch)."""
        return _acquired(self._transactions)

    def statement(self) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]:
        """A pooled connection for a few short statements (a lease and its completion check)."""
        return _acquired(self._database)

    def transaction(self, connection: asyncpg.Connection) -> contextlib.AbstractAsyncContextManager[object]:
        """The handler's transaction: the turn, the handler, the completion row."""
        return connection.transaction()

    # -- the key's lease and fencing token (key_fences) -------------------------

    async def take_leases(self, connection: asyncpg.Connection, keys: list[str], ttl_ms: int) -> dict[str, Lease]:
        """The leases granted among `keys` (distinct), in one statement outside any transaction."""
        sent_at = time.monotonic()
        async with closed_if_left_by(connection, TIMED_OUT):
            rows = await _fetch_again_on_conflict(
                connection, SQL["take_leases"], keys, ttl_ms, timeout=STATEMENT_SECONDS
            )
        return {
            row["key"]: Lease(
                row["key"], row["token"], sent_at, HandedOn(row["replay_of"], row["attempt"], row["payload_sha256"])
            )
            for row in rows
        }

    async def extend_leases(self, leases: list[Lease], ttl_ms: int) -> set[tuple[str, int]]:
        """The (key, token) of `leases` still ours, now running `ttl_ms` longer
        (one statement for a whole worker's renewals: workers/claim/renewals.py).

        When the renewal pool needs a new session and a full server refuses
        it (its session was dropped: a TCP reset, a timed-out renewal, an
        operator's pg_terminate_backend), the statement goes on a
        short-statement session, kept open for the claim path (never a
        handler's or the bookkeeping's): a refusal is an answer, Postgres is
        up, and a lease left to run out meanwhile would cost every run's call."""
        try:
            return await self._extend_leases_on(self._renewals, leases, ttl_ms)
        except asyncpg.TooManyConnectionsError:
            if self._renewals is self._database:
                raise
            log.info("lease_renewal_on_statement_session")
            return await self._extend_leases_on(self._database, leases, ttl_ms)

    async def _extend_leases_on(
        self, pool: asyncpg.Pool | asyncpg.Connection, leases: list[Lease], ttl_ms: int
    ) -> set[tuple[str, int]]:
        try:
            async with (
                self._connection(pool, timeout=ttl_ms / 3000) as connection,
                closed_if_left_by(connection, TIMED_OUT),
            ):
                rows = await _fetch_again_on_conflict(
                    connection, SQL["extend_leases"], *_columns(leases), ttl_ms, timeout=ttl_ms / 3000
                )
        except asyncpg.ReadOnlySQLTransactionError:  # a session opened before a failover: open new ones
            if isinstance(pool, asyncpg.Pool):
                await pool.expire_connections()
            raise
        return {(row["key"], row["token"]) for row in rows}

    async def release_leases(self, leases: list[Lease]) -> None:
        """Best effort: a lease not released runs out by itself."""
        if not leases:
            return
        try:
            async with self._connection(timeout=5) as connection, closed_if_left_by(connection, TIMED_OUT):
                await _fetch_again_on_conflict(connection, SQL["release_leases"], *_columns(leases), timeout=5)
        except Exception as exc:  # noqa: BLE001 - Postgres away: the lease expires instead
            log.info("lease_release_failed", error=describe(exc))

    async def record_handed_on(self, message: EventMessage) -> None:
        """Remembers that `message`'s attempt was handed on (`workers.claim.attempts`);
        returns only once committed, waiting while Postgres is away (the next
        attempt is already durable: running this one again is what must not happen)."""
        for pause in pauses():
            try:
                async with self._connection(timeout=10) as connection, closed_if_left_by(connection, TIMED_OUT):
                    # idempotent: a statement lost in a black hole is made again
                    await connection.execute(
                        SQL["record_handed_on"],
                        message.key,
                        message.replay_of,
                        message.attempt,
                        message.payload_sha256,
                        message.arrival,
                        timeout=10,
                    )
                return
            except (*POSTGRES_LOST, OSError, asyncio.TimeoutError) as exc:
                log.warning("attempt_record_waiting_for_postgres", error=describe(exc), retry_in=pause)
                await asyncio.sleep(pause)

    # -- in the handler's transaction -------------------------------------------

    async def take_turn(self, connection: asyncpg.Connection, key: str) -> bool:
        """The key's advisory lock, without waiting; held until the transaction ends."""
        return bool(await connection.fetchval(SQL["take_turn"], key))

    async def take_turns(self, connection: asyncpg.Connection, keys: list[str]) -> set[str]:
        """take_turn for distinct keys: those whose turn we got."""
        return {row["key"] for row in await connection.fetch(SQL["take_turns"], keys)}

    async def check_completed(self, connection: asyncpg.Connection, keys: list[str]) -> dict[str, str]:
        """completed_keys as a short statement of its own (runs' checks after
        their leases, workers/claim/coalesced.py): read in a statement after the
        one that granted each lease, so it sees the completion of a holder
        that committed while we waited for the row."""
        async with closed_if_left_by(connection, TIMED_OUT):
            rows = await connection.fetch(SQL["completed_keys"], keys, timeout=STATEMENT_SECONDS)
        return {row["key"]: row["payload_sha256"] for row in rows}

    async def completed_keys(self, connection: asyncpg.Connection, keys: list[str]) -> dict[str, str]:
        """completed_key for many keys: {key: payload hash} of those completed."""
        return {row["key"]: row["payload_sha256"] for row in await connection.fetch(SQL["completed_keys"], keys)}

    async def complete_event(self, connection: asyncpg.Connection, message: EventMessage, token: int) -> bool:
        """The completion row, refused (False) unless `token` is the key's
        current one and the key is not completed yet; ends the lease. An
        ordered row's (`message.ordered`) also advances its lane, and is
        refused unless the lane's token is still its holder's."""
        return await connection.fetchval(SQL["complete_event"], *completion_row(message, token)) is not None

    async def complete_events(
        self, connection: asyncpg.Connection, completions: Sequence[tuple[EventMessage, int]]
    ) -> int:
        """complete_event for a batch of (message, token); how many were inserted."""
        return len(await self._complete_events(connection, completions))

    async def complete_alone(
        self, connection: asyncpg.Connection, completions: Sequence[tuple[EventMessage, int]]
    ) -> set[str]:
        """complete_events for handlers that never used `ctx.db`, as an
        autocommit statement of its own (workers/claim/coalesced.py; distinct
        keys); the keys it completed."""
        rows = [completion_row(message, token) for message, token in completions]
        async with closed_if_left_by(connection, TIMED_OUT):
            inserted = await _fetch_again_on_conflict(
                connection, SQL["complete_events"], *map(list, zip(*rows)), timeout=STATEMENT_SECONDS
            )
        return {row["key"] for row in inserted}

    async def _complete_events(
        self, connection: asyncpg.Connection, completions: Sequence[tuple[EventMessage, int]]
    ) -> set[str]:
        rows = [completion_row(message, token) for message, token in completions]
        inserted = await connection.fetch(SQL["complete_events"], *map(list, zip(*rows)))
        return {row["key"] for row in inserted}

    # -- on a connection of their own ------------------------------------------

    async def completed_sha256(self, key: str, connection: asyncpg.Connection | None = None) -> str | None:
        """The payload hash `key` completed with, None while it has not; on
        `connection` when given (the poison drainer records a dead letter on
        it next), else on one of its own."""
        async with self._connection(connection) as connection, closed_if_left_by(connection, TIMED_OUT):
            return await connection.fetchval(SQL["completed_sha256"], key, timeout=STATEMENT_SECONDS)

    async def record_conflict(self, message: EventMessage, completed_sha256: str) -> None:
        async with self._connection() as connection, closed_if_left_by(connection, TIMED_OUT):
            await connection.execute(
                SQL["record_conflict"],
                message.key,
                message.source,
                message.event_id,
                completed_sha256,
                message.payload_sha256,
                timeout=STATEMENT_SECONDS,
            )

    async def settled_before(self, message: EventMessage) -> Settled:
        """A redelivered message: did its own earlier delivery complete the
        event, or is the event an open dead letter already?"""
        async with self._connection() as connection, closed_if_left_by(connection, TIMED_OUT):
            settled = await connection.fetchrow(
                SQL["settled_before"],
                message.key,
                message.payload_sha256,
                message.message_id,
                timeout=STATEMENT_SECONDS,
            )
        return Settled(settled["completed"], settled["dead"])

    async def probe_writable(self) -> None:
        """Up means writable: a demoted primary answers reads but refuses every
        write. A session opened against it keeps its read-only default after
        the failover, so the pools open new ones."""
        async with self._connection(timeout=PROBE_SECONDS) as connection, closed_if_left_by(connection, TIMED_OUT):
            if not await connection.fetchval(SQL["writable"], timeout=PROBE_SECONDS):
                await self.expire_sessions()
                raise ConnectionError("Postgres answers but is read-only")

    async def expire_sessions(self) -> None:
        """Every pool opens new sessions: one opened against a read-only
        server keeps its read-only default after a failover."""
        for pool in (self._database, self._renewals, self._transactions):
            if isinstance(pool, asyncpg.Pool):
                await pool.expire_connections()

    # -- retention (webhook-ingest prune) --------------------------------------

    async def prune(self, window: timedelta, batch_size: int = PRUNE_BATCH) -> int:
        """Delete `processed_events` completed, and `key_fences` and idle
        ordering keys' lanes untouched, before now - `window`; batch by
        batch, each its own short transaction. The
        archive's rows of a batch's events still unsettled are settled from
        its completions in its transaction (ArchiveStore.settle_pruned).
        Returns how many completion records went."""
        async with self._connection() as connection:
            cutoff = await connection.fetchval(SQL["retention_cutoff"], window)
            archive = ArchiveStore(connection)
            pruned = 0
            while True:
                async with connection.transaction():
                    forgotten = await connection.fetch(SQL["prune_completed_events"], cutoff, batch_size)
                    await archive.settle_pruned(forgotten)
                pruned += len(forgotten)
                if len(forgotten) < batch_size:
                    break
            await _delete_in_batches(connection, SQL["prune_key_fences"], cutoff, batch_size)
            await _delete_in_batches(connection, SQL["prune_idle_lanes"], cutoff, batch_size)
        return pruned


async def _fetch_again_on_conflict(
    connection: asyncpg.Connection, query: str, *args, timeout: float
) -> list[asyncpg.Record]:
    """`query`, an autocommit statement, sent again when Postgres ended it
    for a lock conflict (LOCK_CONFLICTS), up to STATEMENT_TRIES times."""
    for tries_left in reversed(range(STATEMENT_TRIES)):
        try:
            return await connection.fetch(query, *args, timeout=timeout)
        except LOCK_CONFLICTS as exc:
            if not tries_left:
                raise
            log.warning("statement_sent_again", error=describe(exc))
    raise AssertionError("unreachable")


def _acquired(
    database: asyncpg.Pool | asyncpg.Connection,
) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]:
    if isinstance(database, asyncpg.Pool):
        return database.acquire()
    return contextlib.nullcontext(database)


def completion_row(message: EventMessage, token: int) -> tuple:
    """complete_event's arguments; the arrival names the archived arrival that ran (shared/archive/settling.py);
    an ordered row's lane, the lane holder's token, its seq, its `by` and whether it completes unrun (stale),
    so that its completion advances its lane (docs/design.md, "Ordering keys")."""
    step = message.ordered
    return (
        message.key,
        message.source,
        message.event_id,
        message.payload_sha256,
        token,
        message.attempt,
        message.message_id or None,
        message.arrival or None,
        None if step is None else step.lane,
        None if step is None else step.token,
        None if step is None else step.seq,
        None if step is None else step.by,
        step is not None and step.stale,
    )


def _columns(leases: list[Lease]) -> tuple[list[str], list[int]]:
    return [lease.key for lease in leases], [lease.token for lease in leases]


async def _delete_in_batches(connection: asyncpg.Connection, query: str, cutoff: datetime, batch_size: int) -> int:
    total = 0
    while True:
        status = await connection.execute(query, cutoff, batch_size)  # "DELETE 5000"
        deleted = int(status.split()[-1])
        total += deleted
        if deleted < batch_size:
            return total
