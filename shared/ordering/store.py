"""Ordering keys' statements that several sides run, each over a
connection its caller holds (in its transaction, when it has one), with the
named SQL of shared/ordering/queries.sql: the insert (the ingress, a replay
by selection), a dead letter's replay in place and discard, and the reads
of the console, the admin API, the CLI and the gauges. Why each statement
locks what it does is said beside it, in the SQL.
"""

from collections.abc import Sequence

import asyncpg

from webhook_ingest.shared.db import load_queries

from .model import Accepted, BlockedLane, LaneRow, LaneState, OrderedRow, Waiting, lane_value

SQL = load_queries("webhook_ingest.shared.ordering")
LANE_ROWS = 50  # the rows `lane_state` shows


async def insert_ordered(conn: asyncpg.Connection, rows: Sequence[OrderedRow]) -> list[Accepted]:
    """Appends `rows` (a lane's rows in arrival order) to their lanes; each row's place, in the order given."""
    if not rows:
        return []
    columns = (
        [row.lane for row in rows],
        [row.source for row in rows],
        [row.route for row in rows],
        [row.key for row in rows],
        [row.arrival for row in rows],
        [row.by_value for row in rows],
        [row.body for row in rows],
        [row.amqp_headers for row in rows],
        [row.replay_of for row in rows],
    )
    records = await conn.fetch(SQL["insert_ordered"], *columns)
    return [Accepted(record["lane"], record["seq"], record["woke"]) for record in records]


async def replay_in_place(conn: asyncpg.Connection, dead_letter_id: int, replay_id: int) -> str | None:
    """The dead letter's ordered row pending again in its place, its block cleared:
    the lane to wake; None when the dead letter is not an ordered row."""
    lane: str | None = await conn.fetchval(SQL["replay_in_place"], dead_letter_id, replay_id)
    return lane


async def discard_ordered(conn: asyncpg.Connection, dead_letter_ids: Sequence[int]) -> list[str]:
    """The dead letters' ordered rows deleted, the lanes they blocked free: those lanes, to wake."""
    records = await conn.fetch(SQL["discard_ordered"], list(dead_letter_ids))
    return sorted(record["lane"] for record in records)


async def blocked_lanes(conn: asyncpg.Connection, source: str | None, limit: int) -> list[BlockedLane]:
    """Lanes a dead letter blocks, oldest block first."""
    records = await conn.fetch(SQL["blocked_lanes"], source, limit)
    return [
        BlockedLane(
            lane=record["lane"],
            source=record["source"],
            route=record["route"] or "",
            value=lane_value(record["lane"]),
            since=record["blocked_since"],
            age_seconds=record["age_seconds"],
            dead_letter_id=record["dead_letter_id"],
            waiting=record["waiting"],
        )
        for record in records
    ]


async def lane_state(conn: asyncpg.Connection, lane: str) -> LaneState | None:
    """One lane: its holder, lease, block, and its first LANE_ROWS rows; None: no such lane."""
    record = await conn.fetchrow(SQL["lane_state"], lane)
    if record is None:
        return None
    rows = await conn.fetch(SQL["lane_rows"], lane, LANE_ROWS)
    return LaneState(
        **{name: record[name] for name in _LANE_COLUMNS},
        route=record["route"] or "",
        value=lane_value(lane),
        held=bool(record["held"]),
        rows=tuple(LaneRow(**dict(row)) for row in rows),
    )


_LANE_COLUMNS = (
    "lane",
    "source",
    "next_seq",
    "pending",
    "token",
    "holder",
    "lease_until",
    "ready_at",
    "last_by",
    "blocked_by",
    "blocked_since",
)


async def waiting_by_source(conn: asyncpg.Connection) -> dict[str, Waiting]:
    """Per source with ordered rows: how many wait and how long, how many lanes are blocked and how long."""
    records = await conn.fetch(SQL["waiting_by_source"])
    return {
        record["source"]: Waiting(
            record["waiting"], record["oldest_seconds"], record["blocked"], record["blocked_oldest_seconds"]
        )
        for record in records
    }


async def waiting_lanes(conn: asyncpg.Connection) -> dict[tuple[str, str], int]:
    """Per (source, route; "": the source's own): how many lanes have rows waiting."""
    records = await conn.fetch(SQL["waiting_lanes"])
    return {(record["source"], record["route"]): record["lanes"] for record in records}
