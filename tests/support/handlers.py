"""Handlers the acceptance tests configure as `tests.support.handlers:NAME`.

Each records what it did in tables the test creates (`effects`, `runs`), so
the test can count effects and see overlaps through Postgres.
"""

import asyncio
import os
import random
import time

import asyncpg

from webhook_ingest.workers.handlers import PermanentError
from webhook_ingest.workers.handlers.forward import handle as forward
from webhook_ingest.workers.handlers.inbox import handle as inbox

EFFECTS_TABLES = """
CREATE TABLE effects (key text NOT NULL, pid integer NOT NULL);
CREATE TABLE runs (key text NOT NULL, pid integer NOT NULL, started double precision, ended double precision);
CREATE TABLE runs_started (key text NOT NULL, pid integer NOT NULL);
"""


async def counted_inbox(event, ctx):
    """inbox, plus a row in `effects`, which has no unique key: a second run
    of one event shows as a second row instead of failing the insert."""
    await ctx.db.execute("INSERT INTO effects (key, pid) VALUES ($1, $2)", event.key, os.getpid())
    await inbox(event, ctx)


counted_inbox.batchable = True


async def slow_inbox(event, ctx):
    """counted_inbox, after 20–50 ms of 'work'."""
    await asyncio.sleep(random.uniform(0.02, 0.05))
    await counted_inbox(event, ctx)


async def one_second_inbox(event, ctx):
    await asyncio.sleep(1.0)
    await counted_inbox(event, ctx)


async def external_effect(event, ctx):
    """An external side effect: recorded through its own connection (outside
    the completion transaction), like an HTTP call would be."""
    connection = await asyncpg.connect(ctx.options["database_url"])
    try:
        started = time.time()
        await asyncio.sleep(0.3)
        await connection.execute(
            "INSERT INTO runs (key, pid, started, ended) VALUES ($1, $2, $3, $4)",
            event.key,
            os.getpid(),
            started,
            time.time(),
        )
    finally:
        await connection.close()
    await inbox(event, ctx)


async def paused_holder(event, ctx):
    """The first run blocks its whole process past the lock TTL (a GC pause,
    a stalled VM); any later run is slow but healthy."""
    first = await ctx.db.fetchval("SELECT count(*) = 0 FROM runs_started WHERE key = $1", event.key)
    await _mark_started(ctx.options["database_url"], event.key)
    if first:
        time.sleep(float(ctx.options.get("pause_seconds", 3)))  # blocks the event loop: no lock extension
    else:
        await asyncio.sleep(float(ctx.options.get("takeover_seconds", 4)))
    await ctx.db.execute("INSERT INTO effects (key, pid) VALUES ($1, $2)", event.key, os.getpid())


async def _mark_started(database_url: str, key: str) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute("INSERT INTO runs_started (key, pid) VALUES ($1, $2)", key, os.getpid())
    finally:
        await connection.close()


async def always_fails(event, ctx):
    raise RuntimeError(f"boom on attempt {event.attempt}")


async def permanently_fails(event, ctx):
    raise PermanentError("this event can never succeed")


async def kills_its_process(event, ctx):
    """A poison event: takes its worker down (as a segfault or the OOM killer would)."""
    if event.payload.get("poison"):
        os._exit(137)
    await inbox(event, ctx)


async def inbox_failing_odd_ids_once(event, ctx):
    """A batchable inbox whose odd-numbered events fail on their first attempt,
    after writing their row: the batch they share must roll back whole."""
    await inbox(event, ctx)
    if event.attempt == 1 and int(event.event_id.rsplit("_", 1)[1]) % 2:
        raise RuntimeError("odd event, first attempt")


inbox_failing_odd_ids_once.batchable = True


async def holds_its_first_run(event, ctx):
    """A key's first run marks itself started, then never ends (its worker is
    killed); any later run is counted_inbox. Not batchable: it runs alone,
    beside the batches."""
    first = await ctx.db.fetchval("SELECT count(*) = 0 FROM runs_started WHERE key = $1", event.key)
    if first:
        await _mark_started(ctx.options["database_url"], event.key)
        await asyncio.sleep(3600)
    await counted_inbox(event, ctx)


async def call_then_record(event, ctx):
    """A payment API call (`forward` to handler_options.url), then a write
    through ctx.db: the transaction opens after the network wait."""
    await forward(event, ctx)
    await ctx.db.execute("INSERT INTO effects (key, pid) VALUES ($1, $2)", event.key, os.getpid())


async def writes_then_waits(event, ctx):
    """counted_inbox, then 300 ms with its transaction still open: a handler
    that writes first, then calls the network."""
    await counted_inbox(event, ctx)
    await asyncio.sleep(0.3)


async def writes_calls_then_fails_some(event, ctx):
    """counted_inbox, then a downstream call (`forward` to handler_options.url)
    with its transaction still open; every fourth event (by its id's number)
    is then refused for good: a dead letter."""
    await counted_inbox(event, ctx)
    await forward(event, ctx)
    if int(event.event_id.rsplit("_", 1)[1]) % 4 == 0:
        raise PermanentError("the downstream's answer says never")
