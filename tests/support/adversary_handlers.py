"""Handlers of tests/acceptance/test_adversary.py (`tests.support.adversary_handlers:NAME`).

Like tests.support.handlers, they record what they did in the `effects`,
`runs` and `runs_started` tables (created by the `effects_tables` fixture)
through a connection of their own, outside the completion transaction, as
an external side effect (an HTTP call) would be.
"""

import asyncio
import os
import time

import asyncpg


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
    if event.attempt == 1:
        shared_call = asyncio.get_running_loop().create_future()
        shared_call.cancel()
        await shared_call
    await ctx.db.execute("INSERT INTO effects (key, pid) VALUES ($1, $2)", event.key, os.getpid())


async def kills_its_worker_recorded(event, ctx):
    """A poison event: each run is a row in `runs` (`started`: the attempt),
    committed on a connection of its own; then it takes its worker down, as
    a segfault or the OOM killer would."""
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
    os._exit(137)


async def busy_external(event, ctx):
    """A `seconds`-long (default 12) external call whose answer streams in
    and is worked on as it comes: `busy_ms` (default 3) of the loop's time
    every 20 ms, without Postgres; then a write through `ctx.db`. A few of
    them in flight keep the worker's loop late at every step (a loaded
    loop). Its start is a line `start key pid` in the file `intervals`, its
    call a line `key pid started ended` — also when it is cancelled."""
    path = ctx.options["intervals"]
    with open(path, "a") as intervals:
        intervals.write(f"start {event.key} {os.getpid()}\n")
    started = time.time()
    try:
        while time.time() < started + float(ctx.options.get("seconds", 12)):
            await asyncio.sleep(0.02)
            time.sleep(float(ctx.options.get("busy_ms", 3)) / 1000)  # parsing what came in
    finally:
        with open(path, "a") as intervals:
            intervals.write(f"{event.key} {os.getpid()} {started} {time.time()}\n")
    await ctx.db.execute("INSERT INTO effects (key, pid) VALUES ($1, $2)", event.key, os.getpid())
