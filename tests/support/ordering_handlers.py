"""Handlers of the ordering keys' acceptance tests (tests/acceptance/test_ordering.py),
configured as `tests.support.ordering_handlers:NAME`.

An event's body names its lane's value (`object`) and its `version`; what it
asks of its run: `sleep` seconds (else 0-`max_sleep` at random, so that
unordered runs overtake each other), failing while its attempt is at most
`fail_attempts`. Each run records its start through a connection of its own
(`version_starts`, an external effect: seen even if the run never ends) and,
through `ctx.db` in the completion transaction, its effect
(`version_runs`: lane, version, pid, start, end).
"""

import asyncio
import os
import random
import time

import asyncpg

ORDERING_TABLES = """
CREATE TABLE version_starts (object text NOT NULL, version integer NOT NULL, pid integer NOT NULL,
    attempt integer NOT NULL, started double precision NOT NULL);
CREATE TABLE version_runs (object text NOT NULL, version integer NOT NULL, pid integer NOT NULL,
    started double precision NOT NULL, ended double precision NOT NULL);
"""


async def record_version(event, ctx):
    payload = event.payload
    started = time.time()
    connection = await asyncpg.connect(ctx.options["database_url"])
    try:
        await connection.execute(
            "INSERT INTO version_starts VALUES ($1, $2, $3, $4, $5)",
            str(payload.get("object")),
            int(payload.get("version", 0)),
            os.getpid(),
            event.attempt,
            started,
        )
    finally:
        await connection.close()
    if event.attempt <= int(payload.get("fail_attempts", 0)):
        raise RuntimeError(f"version {payload.get('version')} fails attempt {event.attempt} on purpose")
    await asyncio.sleep(float(payload.get("sleep", random.uniform(0, float(ctx.options.get("max_sleep", 0.03))))))
    await ctx.db.execute(
        "INSERT INTO version_runs VALUES ($1, $2, $3, $4, $5)",
        str(payload.get("object")),
        int(payload.get("version", 0)),
        os.getpid(),
        started,
        time.time(),
    )


async def record_version_quickly(event, ctx):
    """A batchable twin of record_version: its effect through ctx.db alone, no sleep."""
    now = time.time()
    await ctx.db.execute(
        "INSERT INTO version_runs VALUES ($1, $2, $3, $4, $5)",
        str(event.payload.get("object")),
        int(event.payload.get("version", 0)),
        os.getpid(),
        now,
        now,
    )


async def record_versions_quickly(events, ctx):
    """record_version_quickly's batch form (`handle.batch`): one statement, one `started` for the call."""
    now = time.time()
    await ctx.db.execute(
        "INSERT INTO version_runs SELECT object, version, $3, $4, $4 FROM unnest($1::text[], $2::int[])"
        " AS runs(object, version)",
        [str(event.payload.get("object")) for event in events],
        [int(event.payload.get("version", 0)) for event in events],
        os.getpid(),
        now,
    )


record_version_quickly.batchable = True  # type: ignore[attr-defined]
record_version_quickly.batch = record_versions_quickly  # type: ignore[attr-defined]


async def forgot_ctx(event):  # type: ignore[no-untyped-def]  # a handler written without ctx: its call raises
    raise AssertionError("never reached: calling it with (event, ctx) raises TypeError")
