"""A lane holder's statements in Postgres (workers/ordering/queries.sql):
take a lane's lease, keep it, read its next rows, finish a row done
elsewhere, a failed row's retry in place or its dead letter, let the lane
go; and the watchdog's look for lanes to take. Each is one statement on a
pooled connection of its own (the claim path's short-statement pool), but
`dead`, which runs in the dead letter's transaction.

The completion that advances a lane is CompletionStore's (workers/queries.sql).
"""

import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from decimal import Decimal

import asyncpg

from webhook_ingest.shared.db import closed_if_left_by, load_queries
from webhook_ingest.shared.ordering import waiting_by_source

SQL = load_queries("webhook_ingest.workers.ordering")
STATEMENT_SECONDS = 5.0
TIMED_OUT = (TimeoutError,)


@dataclass(frozen=True)
class Taken:
    token: int
    expired: bool  # the previous holder's lease ran out (it did not let go)


@dataclass(frozen=True)
class PendingRow:
    seq: int
    by_value: Decimal | None
    body: bytes
    amqp_headers: bytes
    attempt: int
    replay_of: int
    errors: tuple[dict, ...]
    deliveries: int


@dataclass(frozen=True)
class Page:
    ours: bool  # the token is still the lane's
    last_by: Decimal | None
    due_in: float | None  # seconds until the hold is over (<= 0 or None: due)
    rows: tuple[PendingRow, ...]


@dataclass(frozen=True)
class Idle:
    ours: bool
    released: bool


def _page_of(rows: Sequence[asyncpg.Record]) -> Page:
    if not rows:
        return Page(False, None, None, ())
    first = rows[0]
    return Page(
        bool(first["ours"]),
        first["last_by"],
        first["due_in"],
        tuple(
            PendingRow(
                row["seq"],
                row["by_value"],
                row["body"],
                row["amqp_headers"],
                row["attempt"],
                row["replay_of"],
                tuple(json.loads(row["errors"])),
                row["deliveries"],
            )
            for row in rows
            if row["seq"] is not None
        ),
    )


class LaneStore:
    def __init__(self, database: asyncpg.Pool | asyncpg.Connection):
        self._database = database

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[asyncpg.Connection]:
        if isinstance(self._database, asyncpg.Pool):
            async with self._database.acquire(timeout=STATEMENT_SECONDS) as connection:
                async with closed_if_left_by(connection, TIMED_OUT):
                    yield connection
        else:
            yield self._database

    async def take(self, lane: str, holder: str, ttl_ms: int) -> Taken | None:
        async with self._connection() as connection:
            row = await connection.fetchrow(SQL["take_lane"], lane, holder, ttl_ms, timeout=STATEMENT_SECONDS)
        return None if row is None else Taken(row["token"], row["expired"])

    async def extend(self, lanes: Sequence[tuple[str, int]], ttl_ms: int) -> set[tuple[str, int]]:
        """The (lane, token) still ours among `lanes`, now a TTL longer."""
        async with self._connection() as connection:
            rows = await connection.fetch(
                SQL["extend_lanes"],
                [lane for lane, _ in lanes],
                [token for _, token in lanes],
                ttl_ms,
                timeout=ttl_ms / 3000,
            )
        return {(row["lane"], row["token"]) for row in rows}

    async def page(self, lane: str, token: int, size: int, hold_seconds: float) -> Page:
        async with self._connection() as connection:
            rows = await connection.fetch(SQL["page"], lane, token, size, hold_seconds, timeout=STATEMENT_SECONDS)
        return _page_of(rows)

    async def take_many(self, lanes: Sequence[str], holder: str, ttl_ms: int) -> dict[str, Taken]:
        """`take` for distinct `lanes` in one statement: those granted."""
        async with self._connection() as connection:
            rows = await connection.fetch(SQL["take_lanes"], list(lanes), holder, ttl_ms, timeout=STATEMENT_SECONDS)
        return {row["lane"]: Taken(row["token"], row["expired"]) for row in rows}

    async def pages(self, lanes: Sequence[tuple[str, int, float]], size: int) -> dict[str, Page]:
        """`page` for distinct (lane, token, hold seconds) in one statement; a lane missing is not ours."""
        async with self._connection() as connection:
            rows = await connection.fetch(SQL["pages"], *map(list, zip(*lanes)), size, timeout=STATEMENT_SECONDS)
        by_lane: dict[str, list] = {}
        for row in rows:
            by_lane.setdefault(row["lane"], []).append(row)
        return {lane: _page_of(by_lane.get(lane, [])) for lane, _, _ in lanes}

    async def release_many_if_idle(self, lanes: Sequence[tuple[str, int]]) -> dict[str, Idle]:
        """`release_if_idle` for distinct (lane, token) in one statement."""
        async with self._connection() as connection:
            rows = await connection.fetch(
                SQL["release_lanes_if_idle"], *map(list, zip(*lanes)), timeout=STATEMENT_SECONDS
            )
        found = {row["lane"]: Idle(bool(row["ours"]), bool(row["released"])) for row in rows}
        return {lane: found.get(lane, Idle(False, False)) for lane, _ in lanes}

    async def finish(self, lane: str, token: int, seq: int) -> bool:
        async with self._connection() as connection:
            return bool(await connection.fetchval(SQL["finish"], lane, token, seq, timeout=STATEMENT_SECONDS))

    async def retry_in_place(
        self, lane: str, token: int, seq: int, attempt: int, error: dict, delay_seconds: float
    ) -> bool | None:
        """Whether the row moved to its next attempt (False: by this call sent
        before, its answer lost); None: `token` is not the lane's, nothing done."""
        async with self._connection() as connection:
            row = await connection.fetchrow(
                SQL["retry_in_place"],
                lane,
                token,
                seq,
                attempt,
                json.dumps(error, default=str),
                delay_seconds,
                timeout=STATEMENT_SECONDS,
            )
        return None if row is None else bool(row["moved"])

    async def release_if_idle(self, lane: str, token: int) -> Idle:
        async with self._connection() as connection:
            row = await connection.fetchrow(SQL["release_if_idle"], lane, token, timeout=STATEMENT_SECONDS)
        return Idle(False, False) if row is None else Idle(bool(row["ours"]), bool(row["released"]))

    async def release(self, lane: str, token: int, ready_in: float | None = None) -> bool:
        async with self._connection() as connection:
            released = await connection.fetchval(SQL["release"], lane, token, ready_in, timeout=STATEMENT_SECONDS)
        return released is not None

    async def runnable(
        self, sources: Sequence[str], limit: int, within: float = 1.0, routes: Sequence[str] = ()
    ) -> list[tuple[str, float]]:
        """Lanes to take within `within` seconds: (lane, seconds until it may be taken). A route's
        lanes only when `routes` has its `SOURCE#ROUTE`; the sources' own lanes always."""
        if limit <= 0 or not sources:
            return []
        async with self._connection() as connection:
            rows = await connection.fetch(
                SQL["runnable"], list(sources), limit, within, list(routes), timeout=STATEMENT_SECONDS
            )
        return [(row["lane"], row["wait"]) for row in rows]

    async def sources_with_rows(self) -> set[str]:
        """The sources with rows waiting or a lane blocked (the gauges' reading, shared/ordering)."""
        async with self._connection() as connection:
            return set(await waiting_by_source(connection))


async def mark_dead(
    connection: asyncpg.Connection,
    lane: str,
    token: int,
    seq: int,
    attempt: int,
    dead_letter_id: int,
    block: bool,
    errors: Sequence[dict],
) -> bool:
    """The row kept `dead` as `dead_letter_id`, in the dead letter's transaction on `connection`."""
    return bool(
        await connection.fetchval(
            SQL["dead"], lane, token, seq, attempt, dead_letter_id, block, json.dumps(list(errors), default=str)
        )
    )
