"""A handler for the replay tests (`tests.support.replay_handlers:recorded`):
waits about 100 ms, as a real handler calling a service does, then records
its run — one `effects` row (no unique key: a second run is a second row)
and what `event.replay` told it — through `ctx.db`, so a run that does not
commit leaves nothing."""

import asyncio
import os

REPLAY_RUNS_TABLE = "CREATE TABLE replay_runs (key text NOT NULL, event_key text, events_replay bigint)"


async def recorded(event, ctx):
    await asyncio.sleep(0.1)
    await ctx.db.execute("INSERT INTO effects (key, pid) VALUES ($1, $2)", event.key, os.getpid())
    replay = event.replay
    await ctx.db.execute(
        "INSERT INTO replay_runs (key, event_key, events_replay) VALUES ($1, $2, $3)",
        event.key,
        None if replay is None else replay.event_key,
        None if replay is None else replay.events_replay,
    )
