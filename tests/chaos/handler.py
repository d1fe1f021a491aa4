"""The fault run's handler, `tests.chaos.handler:record`.

Options: `runs_database_url` (default: the worker's DATABASE_URL), where
the intervals go; `work_ms`, the work of an event that does not say;
`downstream_url`, where each run that is going to complete first makes its
external call (tests/chaos/downstream.py; none without it).

Each run of the handler is an *interval* in `chaos_runs` (start, end, key,
pid), written through its own connection outside the completion
transaction, as an HTTP call would be: two intervals of one key that
overlap are two external effects at once (docs/reference.md §7.2). That
connection is the harness's, not the product's: a pool of two per process
(the workers' own budget is what is under test), and a Postgres with no
slot left for it is waited for, never a failure of the run. Its Postgres effect
is a row in `chaos_effects` (no unique key, so a second effect is a second
row) plus the built-in `inbox` insert, both in the completion transaction
(docs/reference.md §7.1).

The payload says what to do: `chaos.work_ms` of "work", and
`chaos.fail` = "permanent" (PermanentError), "always" (a retryable error on
every attempt), "first" (a retryable error on attempts up to
`chaos.fail_attempts`) or "until_replayed" (PermanentError, except in a
run a dead-letter replay started), each before the external call.
"""

import asyncio
import os
import time

import asyncpg

from tests.chaos import downstream
from webhook_ingest import PermanentError
from webhook_ingest.workers.handlers.inbox import handle as inbox

CHAOS_TABLES = """
CREATE TABLE IF NOT EXISTS chaos_runs (
    id bigserial PRIMARY KEY, key text NOT NULL, pid integer NOT NULL, attempt integer NOT NULL,
    started timestamptz NOT NULL DEFAULT clock_timestamp(), ended timestamptz);
CREATE INDEX IF NOT EXISTS chaos_runs_key ON chaos_runs (key);
CREATE TABLE IF NOT EXISTS chaos_effects (
    key text NOT NULL, pid integer NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp(),
    transaction_started timestamptz NOT NULL DEFAULT now());  -- = processed_events.completed_at, which prune reads
-- the arrival's receive time: two effects of one arrival (a message run again after prune) are one archived row
ALTER TABLE chaos_effects ADD COLUMN IF NOT EXISTS received_ms bigint;
"""

INTERVAL_CONNECTIONS = 2  # a statement each at a run's start and end: 256 runs at once share them
REFUSED_WAIT_SECONDS = 0.5

_pools: dict[str, asyncio.Task] = {}


async def record(event, ctx):
    directive = event.payload.get("chaos") or {}
    runs_database_url = ctx.options.get("runs_database_url") or os.environ["DATABASE_URL"]
    run_id = await harness_statement(  # stamped by the run's own clock: the statement may wait for a session
        runs_database_url,
        "INSERT INTO chaos_runs (key, pid, attempt, started) VALUES ($1, $2, $3, to_timestamp($4)) RETURNING id",
        event.key,
        os.getpid(),
        event.attempt,
        time.time(),
    )
    try:
        await asyncio.sleep(directive.get("work_ms", int(ctx.options.get("work_ms", 100))) / 1000)
        _fail_if_told(directive, event)
        await downstream.call(event, ctx)  # the external call, once the run is going to complete
    finally:
        ended = time.time()
        await harness_statement(
            runs_database_url, "UPDATE chaos_runs SET ended = to_timestamp($2) WHERE id = $1", run_id, ended
        )
    await ctx.db.execute(
        "INSERT INTO chaos_effects (key, pid, received_ms) VALUES ($1, $2, $3)",
        event.key,
        os.getpid(),
        round(event.received_at.timestamp() * 1000),
    )
    await inbox(event, ctx)


def _fail_if_told(directive: dict, event) -> None:
    attempt = event.attempt
    match directive.get("fail"):
        case "permanent":
            raise PermanentError("chaos: permanent failure injected")
        case "until_replayed" if event.replay is None or event.replay.dead_letter_replay is None:
            raise PermanentError("chaos: permanent failure injected until a dead-letter replay")
        case "always":
            raise RuntimeError(f"chaos: retryable failure injected (attempt {attempt})")
        case "first" if attempt <= directive.get("fail_attempts", 1):
            raise RuntimeError(f"chaos: retryable failure injected on attempt {attempt}")


async def harness_statement(database_url: str, statement: str, *args):
    """One interval statement, waiting while Postgres refuses the harness a
    session (`too many clients already`: a Postgres shared with other work)."""
    while True:
        try:
            return await (await _pool(database_url)).fetchval(statement, *args)
        except asyncpg.TooManyConnectionsError:
            await asyncio.sleep(REFUSED_WAIT_SECONDS)


async def _pool(database_url: str) -> asyncpg.Pool:
    """One small pool per process for the interval records: the external
    system is not the completion's database connection."""
    if database_url not in _pools:  # a task, so concurrent first calls share one pool
        _pools[database_url] = asyncio.ensure_future(_create_pool(database_url))
    creating = _pools[database_url]
    try:
        return await asyncio.shield(creating)
    except asyncpg.TooManyConnectionsError:
        if _pools.get(database_url) is creating:  # refused: the next call tries again
            del _pools[database_url]
        raise


async def _create_pool(database_url: str) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=INTERVAL_CONNECTIONS)
    try:
        await pool.execute(CHAOS_TABLES)  # a staging deployment gets its tables from its first run
    except (asyncpg.UniqueViolationError, asyncpg.DuplicateObjectError, asyncpg.DuplicateTableError):
        pass  # another worker created them at the same moment
    return pool
