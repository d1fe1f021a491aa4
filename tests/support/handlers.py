"""Handlers the acceptance tests configure as `tests.support.handlers:NAME`.

Each records what it did in tables the test creates (`effects`, `runs`,
`runs_started`: the `effects_tables` fixture), so the test can count effects
and see overlaps through Postgres. Those after "External effects" record
through a connection of their own, outside the completion transaction, as an
external side effect (an HTTP call) would be; those after "Refusals quoting
undecodable text" are receivers whose refusal quotes a NUL or a lone
surrogate.
"""

import asyncio
import os
import random
import time

import asyncpg

from webhook_ingest.workers.handlers import PermanentError
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


async def counted_inbox_many(events, ctx):
    """counted_inbox's batch form (`handle.batch`): the same rows, a statement a table."""
    keys = [event.key for event in events]
    await ctx.db.execute("INSERT INTO effects (key, pid) SELECT unnest($1::text[]), $2", keys, os.getpid())
    await inbox.batch(events, ctx)  # type: ignore[attr-defined]


async def paused_batch_many(events, ctx):
    """counted_inbox_many whose first call in the fleet (none in `runs_started` yet)
    blocks its process past the lease TTL after writing its rows, as a GC pause
    or a stalled VM would; its keys go to `runs_started` first. It blocks
    `pause_seconds`, or, with `release_file`, until that file exists (at most
    `pause_seconds`): the test ends the pause once what it waits for happened."""
    first = await ctx.db.fetchval("SELECT count(*) = 0 FROM runs_started")
    keys = [event.key for event in events]
    await counted_inbox_many(events, ctx)
    if first:
        connection = await asyncpg.connect(ctx.options["database_url"])
        try:  # one statement: the test reads them all or none
            await connection.execute(
                "INSERT INTO runs_started (key, pid) SELECT unnest($1::text[]), $2", keys, os.getpid()
            )
        finally:
            await connection.close()
        _block(float(ctx.options.get("pause_seconds", 3)), ctx.options.get("release_file"))


def _block(seconds: float, release_file: str | None) -> None:
    """Blocks the process's loop (no renewal, no timer) `seconds`, or until `release_file` exists."""
    if release_file is None:
        time.sleep(seconds)
        return
    until = time.monotonic() + seconds
    while not os.path.exists(release_file) and time.monotonic() < until:
        time.sleep(0.02)


async def paused_batch(event, ctx):
    """batched_counted_inbox whose first batch form call pauses its process (paused_batch_many)."""
    await counted_inbox(event, ctx)


paused_batch.batchable = True  # type: ignore[attr-defined]
paused_batch.batch = paused_batch_many  # type: ignore[attr-defined]


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
        time.sleep(float(ctx.options.get("pause_seconds", 3)))  # noqa: ASYNC251 - blocks the loop: no lock extension
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


async def forward(event, ctx):
    """The built-in `forward`, imported by the handlers that call it: a worker
    of the others starts without aiohttp (~90 ms of CPU a worker)."""
    from webhook_ingest.workers.handlers.forward import handle

    return await handle(event, ctx)


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


# External effects (recorded on a connection of their own).


async def long_external(event, ctx):
    """An external effect of `seconds` (default 5) that touches `ctx.db` only
    at its end: its start goes to `runs_started`, its interval to `runs` —
    also when it is cancelled, as an effect that stopped then."""
    connection = await asyncpg.connect(ctx.options["database_url"])
    try:
        await connection.execute("INSERT INTO runs_started (key, pid) VALUES ($1, $2)", event.key, os.getpid())
        started = time.time()
        try:
            await asyncio.sleep(float(ctx.options.get("seconds", 5)))
        finally:  # also when cancelled: the effect stopped then, and its interval ends there
            await connection.execute(
                "INSERT INTO runs (key, pid, started, ended) VALUES ($1, $2, $3, $4)",
                event.key,
                os.getpid(),
                started,
                time.time(),
            )
    finally:
        await connection.close()
    await ctx.db.execute("INSERT INTO effects (key, pid) VALUES ($1, $2)", event.key, os.getpid())


async def failing_external(event, ctx):
    """An external effect that always fails after `seconds` (default 0): each
    run is a row in `runs` (`started` is the attempt number, `ended` the
    time it started), then it raises."""
    await _record_run(event, ctx)
    await asyncio.sleep(float(ctx.options.get("seconds", 0)))
    raise RuntimeError(f"the receiver is down (attempt {event.attempt})")


async def fails_until_dead_lettered(event, ctx):
    """A receiver that is down until the event's first dead letter is
    recorded (on-call would look then), and up again from that moment."""
    connection = await asyncpg.connect(ctx.options["database_url"])
    try:
        dead = await connection.fetchval("SELECT count(*) FROM dead_letters WHERE key = $1", event.key)
        await connection.execute(
            "INSERT INTO runs (key, pid, started, ended) VALUES ($1, $2, $3, $4)",
            event.key,
            os.getpid(),
            float(event.attempt),
            time.time(),
        )
    finally:
        await connection.close()
    await asyncio.sleep(float(ctx.options.get("seconds", 0)))
    if not dead:
        raise RuntimeError(f"the receiver is down (attempt {event.attempt})")
    await ctx.db.execute("INSERT INTO effects (key, pid) VALUES ($1, $2)", event.key, os.getpid())


async def cancelled_by_a_library_once(event, ctx):
    """Attempt 1 awaits a future that another task cancelled (a shared
    in-flight call its owner gave up on, as client libraries that
    deduplicate requests do): `CancelledError` reaches the handler although
    its own task was never cancelled. Each run is a row in `runs`
    (`started`: the attempt); later attempts write the effect."""
    await _record_run(event, ctx)
    if event.attempt == 1:
        shared_call = asyncio.get_running_loop().create_future()
        shared_call.cancel()
        await shared_call
    await ctx.db.execute("INSERT INTO effects (key, pid) VALUES ($1, $2)", event.key, os.getpid())


async def kills_its_worker_recorded(event, ctx):
    """A poison event: each run is a row in `runs` (`started`: the attempt),
    committed on a connection of its own; then it takes its worker down, as
    a segfault or the OOM killer would."""
    await _record_run(event, ctx)
    os._exit(137)


async def busy_external(event, ctx):
    """A `seconds`-long (default 12) external call whose answer streams in
    and is worked on as it comes: `busy_ms` (default 3) of the loop's time
    every 20 ms, without Postgres; then a write through `ctx.db`. A few of
    them in flight keep the worker's loop late at every step (a loaded
    loop). Its start is a line `start key pid` in the file `intervals`, its
    call a line `key pid started ended` — also when it is cancelled."""
    path = ctx.options["intervals"]
    with open(path, "a") as intervals:  # noqa: ASYNC230 - one short line to a local file
        intervals.write(f"start {event.key} {os.getpid()}\n")
    started = time.time()
    try:
        while time.time() < started + float(ctx.options.get("seconds", 12)):
            await asyncio.sleep(0.02)
            time.sleep(float(ctx.options.get("busy_ms", 3)) / 1000)  # noqa: ASYNC251 - a busy loop, on purpose
    finally:
        with open(path, "a") as intervals:  # noqa: ASYNC230 - one short line to a local file
            intervals.write(f"{event.key} {os.getpid()} {started} {time.time()}\n")
    await ctx.db.execute("INSERT INTO effects (key, pid) VALUES ($1, $2)", event.key, os.getpid())


# Refusals quoting undecodable text; each run is a row in `runs` (`started`: the attempt).

# What a receiver's answer can hold once decoded: a NUL (a binary body), or a
# lone surrogate (bytes read with errors="surrogateescape", as os and
# subprocess hand them over).
NUL_ANSWER = "name\x00 is not a valid contact"
SURROGATE_ANSWER = b"caf\xe9 is not a valid contact".decode("utf-8", "surrogateescape")


async def _record_run(event, ctx) -> None:
    """The run as a row of `runs` (`started`: the attempt), committed on a connection of its own."""
    connection = await asyncpg.connect(ctx.options["database_url"])
    try:
        await connection.execute(
            "INSERT INTO runs (key, pid, started, ended) VALUES ($1, $2, $3, $4)",
            event.key,
            os.getpid(),
            float(event.attempt),
            time.time(),
        )
    finally:
        await connection.close()


async def refused_quoting_a_nul(event, ctx):
    """The receiver refuses the event for good; the error quotes its answer."""
    await _record_run(event, ctx)
    raise PermanentError(f"the CRM refused it: {NUL_ANSWER}")


async def refused_quoting_a_lone_surrogate(event, ctx):
    await _record_run(event, ctx)
    raise PermanentError(f"the CRM refused it: {SURROGATE_ANSWER}")


async def inbox_alone(event, ctx):
    """`inbox`, not batchable: it runs alone, as `forward` and most handlers do."""
    await inbox(event, ctx)
