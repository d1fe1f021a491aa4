"""A paced run's row lock: what orders a Cancel against the item in flight.

A runner (`shared/paced_runs.py`) reads its run's state, acts on one item
(a publish) and records the step. Read and act as separate statements, a
Cancel landing between them was answered "cancelled" and the item was
published after it anyway (R2 of the event replays adversary round). So the
runner takes its run's row (`SELECT … FOR UPDATE`) in a transaction held
from the state read to the step's commit, and a Cancel — an UPDATE of that
row — waits for it: once a Cancel returns, the runner reads `cancelled`
before its next item, and what the Cancel reports published is all there is.

Both sides are bounded, on the server's side, where a runner that stalls
(a CLI suspended by Ctrl-Z, a process cut from Postgres) cannot keep them
from running out: the runner's transaction ends its session when it sits
idle — waiting on the broker's confirm — or runs one statement longer than
HOLD_SECONDS (the publishes' own limits are shorter), and a Cancel or a
claim waits at most WAIT_SECONDS for the row, past which it is RunBusy and
changed nothing.
"""

import contextlib
from collections.abc import AsyncIterator

import asyncpg

from webhook_ingest.shared.errors import WebhookIngestError

HOLD_SECONDS = 20.0  # a publish's limit (10 s) and a pooled connection's (5 s), with room
WAIT_SECONDS = 30.0  # longer than a runner can hold the row


class RunBusy(WebhookIngestError):
    """The run stayed in the middle of an item too long to wait for: nothing was changed; try again."""


@contextlib.asynccontextmanager
async def holding(connection: asyncpg.Connection) -> AsyncIterator[None]:
    """A transaction for one item; the server ends its session past HOLD_SECONDS
    idle or in one statement, which frees the row of a runner that stalled."""
    limit_ms = int(HOLD_SECONDS * 1000)
    async with connection.transaction():
        await connection.execute(f"SET LOCAL idle_in_transaction_session_timeout = {limit_ms};"
                                 f" SET LOCAL statement_timeout = {limit_ms}")
        yield


async def waiting_for_run(connection: asyncpg.Connection, sql: str, *args) -> asyncpg.Record | None:
    """`sql`'s row (a statement that writes the run's row: a cancel, a claim),
    waiting at most WAIT_SECONDS for a runner's item; RunBusy past that."""
    try:
        async with connection.transaction():
            await connection.execute(f"SET LOCAL lock_timeout = {int(WAIT_SECONDS * 1000)}")
            return await connection.fetchrow(sql, *args)
    except asyncpg.LockNotAvailableError as exc:
        raise RunBusy() from exc
