"""Where an event ended up, read as the acceptance tests check it: the events
queue drained, then completed, an open dead letter or a recorded conflict.

Shared by tests/acceptance/test_exactly_once.py, test_never_concurrently.py,
test_nothing_lost.py and test_retries_and_dead_letters.py."""

import asyncio

import asyncpg

from tests.support.events import queue_depth
from tests.support.processes import wait_until
from webhook_ingest.shared.broker import topology


async def queue_empty(settings) -> bool:
    return await queue_depth(settings.amqp_url, topology.events_queue(settings.namespace)) == 0


async def settled_quietly(settings, seconds: float = 3) -> None:
    """Until the events queue is empty, then a few seconds more: retries
    (0.5 s) and deferrals (1 s) come back within that."""
    await wait_until(lambda: queue_empty(settings), 30, message="an empty queue")
    await asyncio.sleep(seconds)


async def fetchrow(database_url: str, sql: str, *args):
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetchrow(sql, *args)
    finally:
        await connection.close()


async def where_is(database_url: str, key: str) -> dict:
    """Everything the event could have become: completed, a dead letter on-call
    can see, or a conflict recorded for operators."""
    row = await fetchrow(
        database_url,
        """
        SELECT (SELECT count(*) FROM processed_events WHERE key = $1) AS completed,
               (SELECT count(*) FROM dead_letters WHERE key = $1 AND status = 'dead') AS open_dead_letters,
               (SELECT count(*) FROM event_conflicts WHERE key = $1) AS conflicts""",
        key,
    )
    return dict(row)
