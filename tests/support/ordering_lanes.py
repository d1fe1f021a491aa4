"""Ordering lanes written as the runner (package B) leaves them, for the
on-call surfaces' tests: rows appended as the ingress appends them, the
first made a dead letter blocking its lane (`on_dead_letter = "block"`)."""

import dataclasses

import asyncpg

from tests.support.events import make_event
from webhook_ingest.shared.dead_letters import record_dead_letter
from webhook_ingest.shared.ordering import insert_ordered, ordered_row

LANE = "acme:obj_1"


async def block_lane(database_url: str, lane: str = LANE, versions: int = 3, minutes_ago: float = 20) -> int:
    """`versions` events in `lane`, the first dead and blocking the lane since
    `minutes_ago`: its dead letter's id."""
    connection = await asyncpg.connect(database_url)
    try:
        source, _, route = lane.partition(":")[0].partition("#")
        events = [make_event(source, f"evt_{lane}_{n}") for n in range(versions)]
        if route:  # a route's lane: its run of the event, keyed KEY#ROUTE
            events = [dataclasses.replace(e, route=route, key=f"{e.key}#{route}") for e in events]
        await insert_ordered(connection, [ordered_row(event, lane, None) for event in events])
        dead = dataclasses.replace(events[0], attempt=2)
        dead_letter_id = await record_dead_letter(connection, dead, [{"type": "RuntimeError", "attempt": 2}])
        await mark_dead(connection, lane, 1, dead_letter_id, block=True, minutes_ago=minutes_ago)
        return dead_letter_id
    finally:
        await connection.close()


async def mark_dead(
    connection: asyncpg.Connection, lane: str, seq: int, dead_letter_id: int, block: bool, minutes_ago: float = 20
) -> None:
    """Row `seq` of `lane` dead as dead letter `dead_letter_id`, blocking its lane or not."""
    await connection.execute(
        "UPDATE ordered_events SET state = 'dead', dead_letter_id = $3, attempt = 2 WHERE lane = $1 AND seq = $2",
        lane,
        seq,
        dead_letter_id,
    )
    await connection.execute(
        "UPDATE ordering_keys SET pending = pending - 1, blocked_by = CASE WHEN $3 THEN $2::bigint END,"
        " blocked_since = CASE WHEN $3 THEN now() - make_interval(secs => $4) END WHERE lane = $1",
        lane,
        dead_letter_id,
        block,
        minutes_ago * 60.0,
    )
