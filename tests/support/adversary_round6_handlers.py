"""Handlers of tests/acceptance/test_adversary_round6.py (`tests.support.adversary_round6_handlers:NAME`).

Each run is a row in `runs` (`started`: the attempt), committed on a
connection of its own (the `effects_tables` fixture creates the table),
as an external effect would be.
"""

import os
import time

import asyncpg

from webhook_ingest.workers.handlers import PermanentError
from webhook_ingest.workers.handlers.inbox import handle as inbox

# What a receiver's answer can hold once decoded: a NUL (a binary body), or a
# lone surrogate (bytes read with errors="surrogateescape", as os and
# subprocess hand them over).
NUL_ANSWER = "name\x00 is not a valid contact"
SURROGATE_ANSWER = b"caf\xe9 is not a valid contact".decode("utf-8", "surrogateescape")


async def _record_run(event, ctx) -> None:
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
