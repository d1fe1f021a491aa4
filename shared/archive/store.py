"""The event archive's Postgres: the one module that runs its statements
(named blocks of `shared/archive/queries.sql`), for the ingress, the workers and
on-call's tools alike.

Its writes are batches from `shared/archive/writer.py`, never a request's
or a run's own statement; each takes a connection of the pool it is given
and is closed, not waited on, when Postgres does not answer
(`shared/db/sessions.py`).
"""

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta

import asyncpg

from webhook_ingest.shared.db import load_queries, pooled

from . import model as archive
from . import search as archived_events
from . import settling as archive_settling
from .search import NO_ROUTES, Cursor, EventFilter, SourceRoutes

SQL = load_queries("webhook_ingest.shared.archive")
STATEMENT_SECONDS = 10.0  # a batch's statement, or one source's tables
EXPORT_PAGE = 500  # rows a statement of `export`: its memory, and few round trips
SETTLE_PAGE = 500  # rows the settling sweep reads a statement
SETTLE_NAMED_PAGE = 2000  # completions `settle_named` reads a statement
NamedCursor = tuple[datetime, str]  # (completed_at, key) of the last completion `settle_named` read
# processed_events' columns archive_unsettled_of_pruned reads of each completion prune deletes
PRUNED_COLUMNS = ("key", "source", "event_id", "payload_sha256", "attempts", "completed_at", "arrival", "stale")
PRUNED_DEFAULTS = {"stale": False}  # a completion read without it (an older prune statement) is not stale
LOCK_TIMEOUT = "2s"  # making or dropping a day waits this long for the source's table, then tries later


class ArchiveStore:
    def __init__(self, database: asyncpg.Pool | asyncpg.Connection):
        self._database = database  # a pool, or the CLI's (or a test's) one connection

    @property
    def database(self) -> asyncpg.Pool | asyncpg.Connection:
        return self._database

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[asyncpg.Connection]:
        if isinstance(self._database, asyncpg.Pool):
            async with pooled(self._database, STATEMENT_SECONDS) as connection:
                yield connection
        else:
            yield self._database

    @contextlib.asynccontextmanager
    async def _searching(self) -> AsyncIterator[asyncpg.Connection]:
        """A connection whose statements are planned for their own filter.
        The search statements say "no filter" as `$1 IS NULL OR …`; after a
        prepared statement's fifth run Postgres may keep one generic plan for
        every filter, which can neither prune partitions nor know the LIMIT,
        and reads the whole archive (docs/performance.md, "Searching a
        million archived events"). No JIT: a page or a capped count is a few
        ms of work, and reading each row's leases (a routed event's, on its
        routes' keys) puts a count's estimate past jit_above_cost, where
        compiling it cost 100-400 ms. SET LOCAL: gone with the transaction."""
        async with self._connection() as connection, connection.transaction(readonly=True):
            await connection.execute(
                "SET LOCAL plan_cache_mode = force_custom_plan; SET LOCAL jit = off", timeout=STATEMENT_SECONDS
            )
            yield connection

    async def write_arrivals(self, rows: list[tuple]) -> None:
        """`archive.arrival_row`s; a row twice is written once."""
        await self._write(SQL["archive_arrivals"], rows)

    async def write_outcomes(self, rows: list[tuple]) -> None:
        """`archive.outcome_row`s, each judged against what the earlier ones wrote."""
        await self._write(SQL["archive_outcomes"], rows, archive_settling.GRACE_SECONDS)

    async def _write(self, statement: str, rows: list[tuple], *more: object) -> None:
        async with self._connection() as connection:
            for batch in archive.rounds(rows):
                await connection.execute(statement, *archive.columns(batch), *more, timeout=STATEMENT_SECONDS)

    async def settle(
        self,
        grace_seconds: float,
        routes: Mapping[str, list[str]],
        after: Cursor | None = None,
        limit: int = SETTLE_PAGE,
    ) -> tuple[int, Cursor | None]:
        """One page of the settling sweep (shared/archive/settling.py): the
        unsettled rows older than the grace after the row `after` (in the
        order of their whole name, the receive time first), each brought to
        what Postgres recorded of its event. (rows settled, the page's last
        row: where the next page starts; None once the page was the last.)"""
        sources = [source for source, names in routes.items() for _ in names]
        route_names = [name for names in routes.values() for name in names]
        start = (after.received_at, after.source, after.key, after.arrival) if after else (None,) * 4
        async with self._connection() as connection:
            async with connection.transaction(readonly=True):
                # The page in the index's order, from each day's index at once. Else Postgres, counting on
                # small groups of one receive time (the column's statistics), may merge the days by time
                # alone and sort each time's rows: a burst stamped with one millisecond read whole
                # (200,000 rows: 150 ms against 2, docs/performance.md). SET LOCAL: gone with the transaction.
                await connection.execute("SET LOCAL enable_incremental_sort = off", timeout=STATEMENT_SECONDS)
                rows = await connection.fetch(
                    SQL["archive_unsettled"],
                    grace_seconds,
                    start[0],
                    limit,
                    sources,
                    route_names,
                    *start[1:],
                    timeout=STATEMENT_SECONDS,
                )
            writes = archive_settling.settled(rows)
            done = "UPDATE 0"
            if writes:
                received = [write[2] for write in writes]
                done = await connection.execute(
                    SQL["archive_settle"],
                    *archive.columns(writes),
                    min(received),
                    max(received),
                    timeout=STATEMENT_SECONDS,
                )
        return int(done.split()[-1]), Cursor.below(rows[-1]) if len(rows) == limit else None

    async def settle_named(
        self,
        grace_seconds: float,
        lookback_seconds: float,
        after: NamedCursor | None = None,
        limit: int = SETTLE_NAMED_PAGE,
    ) -> tuple[int, NamedCursor | None, bool]:
        """One page of completions, after `after` (None: from `lookback_seconds`
        before the grace), whose named arrivals still archived `duplicate` or
        `conflict` are made `processed` (`archive_settle_named`): a note
        written of an arrival before its own run, whose run's note was lost.
        (rows settled, the last completion read: where the next page starts,
        `after` when none was read; whether the page was full)."""
        start = after or (None, None)
        async with self._connection() as connection:
            row = await connection.fetchrow(
                SQL["archive_settle_named"], *start, grace_seconds, limit, lookback_seconds, timeout=STATEMENT_SECONDS
            )
        last = (row["completed_at"], row["key"]) if row["key"] is not None else after
        return row["settled"], last, row["read"] == limit

    async def settle_pruned(self, completions: Sequence[Mapping]) -> int:
        """The rows still `queued` or `retrying` of the events whose
        `completions` (processed_events rows) `prune` is deleting, settled
        from them as the sweep would (shared/archive/settling.py): to be
        called in prune's transaction, since once the record is gone no
        sweep can say what became of them (a run whose worker was killed
        before its outcome batch would say `queued` for good). Rows settled."""
        if not completions:
            return 0
        async with self._connection() as connection:
            rows = await connection.fetch(
                SQL["archive_unsettled_of_pruned"],
                *([row.get(name, PRUNED_DEFAULTS.get(name)) for row in completions] for name in PRUNED_COLUMNS),
                timeout=STATEMENT_SECONDS,
            )
            writes = archive_settling.settled(rows)
            if not writes:
                return 0
            received = [write[2] for write in writes]
            done = await connection.execute(
                SQL["archive_settle"], *archive.columns(writes), min(received), max(received), timeout=STATEMENT_SECONDS
            )
        return int(done.split()[-1])

    async def keep(self, retentions: Mapping[str, timedelta], now: datetime | None = None) -> tuple[int, int]:
        """Each source's tables made ahead and its days past its retention
        dropped; (days made, days dropped). One autocommit statement per
        source, never a transaction held open: a statement that does not
        end closes its session (the process may be stopping) rather than
        waiting for a rollback's answer."""
        now = now or datetime.now(UTC)
        made = dropped = 0
        for source, retention in retentions.items():
            keep_from, make_from, make_until = archive.kept_days(now, retention)
            async with self._connection() as connection:
                # the session's: a pooled session's reset forgets it, the workers' archive pool is the archive's own
                await connection.execute(f"SET lock_timeout = '{LOCK_TIMEOUT}'", timeout=STATEMENT_SECONDS)
                row = await connection.fetchrow(
                    SQL["archive_keep"],
                    source,
                    archive.source_table(source),
                    keep_from,
                    make_from,
                    make_until,
                    timeout=STATEMENT_SECONDS,
                )
            made, dropped = made + row["made"], dropped + row["dropped"]
        return made, dropped

    async def sizes(self, sources: list[str]) -> dict[str, int]:
        """Bytes on disk of each source's archive."""
        async with self._connection() as connection:
            rows = await connection.fetch(
                SQL["archive_sizes"],
                sources,
                [archive.source_table(source) for source in sources],
                timeout=STATEMENT_SECONDS,
            )
        return {row["source"]: row["bytes"] for row in rows}

    # -- reading (shared/archive/search.py: the filter and the documents) ----------

    async def search(
        self,
        where: EventFilter,
        after: Cursor | None = None,
        limit: int = archived_events.DEFAULT_LIMIT,
        routes: SourceRoutes = NO_ROUTES,
    ) -> list[asyncpg.Record]:
        """One page, newest first, below `after` (None: the newest); a
        routed event `processing` while one of `routes` (the sources file's)
        holds its lease."""
        below = (after.received_at, after.source, after.key, after.arrival) if after else (None,) * 4
        async with self._searching() as connection:
            return await connection.fetch(
                SQL["search_archive"], *where.arguments(), *below, limit, *routes.arguments(), timeout=STATEMENT_SECONDS
            )

    async def export(
        self, where: EventFilter, page_size: int = EXPORT_PAGE, routes: SourceRoutes = NO_ROUTES
    ) -> AsyncIterator[list[asyncpg.Record]]:
        """Every row the filter matches, newest first, in pages of
        `page_size` with their bodies and headers: one short statement a page
        (keyset, like `search`), so a selection of any size costs one page of
        memory and holds no transaction open. `routes` as `search`'s."""
        after: Cursor | None = None
        while True:
            below = (after.received_at, after.source, after.key, after.arrival) if after else (None,) * 4
            async with self._searching() as connection:
                rows = await connection.fetch(
                    SQL["export_archive"],
                    *where.arguments(),
                    *below,
                    page_size,
                    *routes.arguments(),
                    timeout=STATEMENT_SECONDS,
                )
            if rows:
                yield rows
            if len(rows) < page_size:
                return
            after = Cursor.below(rows[-1])

    async def count(
        self, where: EventFilter, cap: int = archived_events.COUNT_CAP, routes: SourceRoutes = NO_ROUTES
    ) -> int:
        """How many rows match, up to `cap`; `routes` as `search`'s."""
        async with self._searching() as connection:
            return await connection.fetchval(
                SQL["count_archive"], *where.arguments(), cap, *routes.arguments(), timeout=STATEMENT_SECONDS
            )

    async def event(self, key: str, routes: Sequence[str] = ()) -> dict | None:
        """Every arrival of `key` and what the pipeline recorded of it, each
        of `routes` (its source's route names: `archived_events.route_names`)
        with its own completion; None when none is archived."""
        arrivals, records = await self.event_rows(key, routes)
        return archived_events.event(key, arrivals, records) if arrivals else None

    async def event_rows(self, key: str, routes: Sequence[str] = ()) -> tuple[list[asyncpg.Record], asyncpg.Record]:
        """What `event` documents, as rows: the arrivals oldest first (bodies
        as bytes, for the console; `processing` while one of `routes` holds
        its lease, for a routed source), the completion, each route's, and
        the dead letters."""
        async with self._connection() as connection:
            arrivals = await connection.fetch(SQL["archived_arrivals"], key, list(routes), timeout=STATEMENT_SECONDS)
            # the arrivals' event id (SOURCE:EVENT_ID's); it tells a route's completion from a plain
            # event's under the same key (docs/design.md, "Routes")
            event_id = arrivals[0]["event_id"] if arrivals else key.split(":", 1)[-1]
            records = await connection.fetchrow(
                SQL["archived_event_records"], key, event_id, list(routes), timeout=STATEMENT_SECONDS
            )
        return arrivals, records

    async def copies(self, keys: list[str]) -> dict[str, tuple[int, int]]:
        """Each key's archived copies (`duplicate`) and conflicts: the console's columns for a page."""
        sources = sorted({key.split(":", 1)[0] for key in keys})
        async with self._connection() as connection:
            rows = await connection.fetch(SQL["archive_copies"], sources, keys, timeout=STATEMENT_SECONDS)
        return {row["key"]: (row["copies"], row["conflicts"]) for row in rows}


async def discarded(connection: asyncpg.Connection, dead_letter_ids: list[int]) -> None:
    """The arrivals of these dead letters are discarded: in the discard's own transaction."""
    await connection.execute(SQL["archive_discarded"], dead_letter_ids)


async def replayed(connection: asyncpg.Connection, dead_letter_id: int, replay_id: int) -> None:
    """The arrival of this dead letter is queued again, in chain `replay_id`:
    in the replay's own transaction, so the replay's outcome — or, were it
    lost with its worker, the settling sweep — writes over it."""
    await connection.execute(SQL["archive_replayed"], [dead_letter_id], replay_id)
