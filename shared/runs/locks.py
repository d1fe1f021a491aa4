"""A paced run's locks: what orders a Cancel against the item in flight, and
what lets a Cancel behind a runner that died tell an item that may have gone.

A runner (`shared/runs/paced.py`) reads its run's state, acts on one item
(a publish) and records the step. Read and act as separate statements, a
Cancel landing between them was answered "cancelled" and the item was
published after it anyway (R2 of the event replays adversary round). So the
runner holds its run for the whole item, and a Cancel or a claim waits for
it: once a Cancel returns, the runner reads `cancelled` before its next
item, and nothing is published after it.

The hold is the run's advisory lock, taken by the runner's session for the
item (`run_lock`), with the run's row (`SELECT … FOR UPDATE`) read under it.
A session lock, because the item is two transactions: the first marks
"item n in flight" and commits before the publish (`Hold.in_flight`), the
second publishes and records the step. A runner that dies mid-publish takes
its step's transaction with it, but not its mark: the Cancel that waited
for it (its session's end lets the lock go) finds item n in flight and not
stepped, and says the item may have been published (docs/design.md, "Paced
runs"). A Cancel and a claim take the same lock
(`waiting_for_run`) before the row, in the runner's order, so neither can
slip between the mark's commit and the publish.

Both sides are bounded, on the server's side, where a runner that stalls
(a CLI suspended by Ctrl-Z, a process cut from Postgres) cannot keep them
from running out: the runner is inside one of its transactions from the
lock to its release (the commit and the next begin are one query), which
end its session — and the lock — when it sits idle (waiting on the
broker's confirm) or runs one statement longer than HOLD_SECONDS (the
publishes' own limits are shorter); a Cancel or a claim waits at most
WAIT_SECONDS for the run, past which it is RunBusy and changed nothing.
"""

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg

from webhook_ingest.shared.db import terminate
from webhook_ingest.shared.errors import WebhookIngestError

HOLD_SECONDS = 20.0  # a publish's limit (10 s) and a pooled connection's (5 s), with room
WAIT_SECONDS = 30.0  # longer than a runner can hold the run

# The advisory lock of run ID of a kind: KIND << 32 | ID, a key space of
# its own in practice (the workers' per-key locks are 64-bit hashes of keys).
EVENT_REPLAYS = 0x72706C79  # "rply"
BULK_ACTIONS = 0x626C6B61  # "blka"


def run_lock(kind: int, run_id: int) -> int:
    return (kind << 32) | (run_id & 0xFFFFFFFF)


# Named in its text, for pg_stat_activity (and the tests that watch a Cancel wait).
WAIT_FOR_RUN = "SELECT pg_advisory_xact_lock($1) -- waiting_for_run: a cancel or a claim waits for the item in flight"


class RunBusy(WebhookIngestError):
    """The run stayed in the middle of an item too long to wait for: nothing was changed; try again."""


@dataclass(frozen=True)
class Hold:
    """A runner's hold of its run for one item (`holding`)."""

    connection: asyncpg.Connection
    lock: int

    async def in_flight(self, sql: str, *args: object) -> None:
        """`sql` (the mark "item n in flight") committed, the run still held:
        the commit and the next transaction's begin are one query, so the
        session is never outside a transaction (unbounded) while it holds it."""
        await self.connection.execute(sql, *args)
        await self.connection.execute(f"COMMIT; BEGIN; {_limits()}")


@contextlib.asynccontextmanager
async def holding(connection: asyncpg.Connection, lock: int) -> AsyncIterator[Hold]:
    """The run held for one item: its advisory lock, in a transaction whose
    end lets it go; the server ends the session past HOLD_SECONDS idle or in
    one statement, which lets go the run of a runner that stalled. An error
    rolls back what the item's last transaction wrote (not a mark committed)."""
    await connection.execute(f"BEGIN; {_limits()}")
    try:
        await connection.execute("SELECT pg_advisory_lock($1)", lock)
        yield Hold(connection, lock)
        await connection.execute(f"COMMIT; SELECT pg_advisory_unlock({int(lock)})")
    except BaseException as failed:  # also a COMMIT that failed: the rest of its query (the unlock) did not run
        try:
            await connection.execute(f"ROLLBACK; SELECT pg_advisory_unlock({int(lock)})")
        except BaseException as gone:  # noqa: BLE001 - its session is gone or going: its end lets the run go
            terminate(connection)
            if isinstance(failed, Exception) and isinstance(gone, _SESSION_GONE):
                raise SessionLost() from failed  # what the item's call said was of the pool, not of this
        raise


class SessionLost(WebhookIngestError):
    """The run's Postgres session ended in the middle of an item: idle or in one statement past its limit
    (HOLD_SECONDS), Postgres restarted, or the connection was cut. Resume it."""

    def __init__(self) -> None:
        super().__init__(
            f"the run's Postgres session ended mid-item (idle or in one statement past "
            f"{HOLD_SECONDS:g} s, a restart, a cut connection): resume it"
        )


# What a call on a session that is gone raises: a pooled one's proxy detached (InterfaceError), the CLI's
# one connection closed, its socket gone.
_SESSION_GONE = (asyncpg.InterfaceError, asyncpg.ConnectionDoesNotExistError, OSError)


def _limits() -> str:
    limit_ms = int(HOLD_SECONDS * 1000)
    return f"SET LOCAL idle_in_transaction_session_timeout = {limit_ms}; SET LOCAL statement_timeout = {limit_ms}"


async def waiting_for_run(
    connection: asyncpg.Connection, lock: int, sql: str, *args: object, settled: str | None = None
) -> asyncpg.Record | None:
    """`sql`'s row (a statement that writes the run's row: a cancel, a claim),
    once no runner holds the run (its item stepped, or its session ended),
    waiting at most WAIT_SECONDS; RunBusy past that. `sql` reads what the
    item's runner committed: it runs after the wait, with a snapshot of its own.
    `settled` (with `sql`'s arguments): a statement run between the two that
    waits, within the same limit, for what else the item may be waiting on
    (the row of the dead letter a bulk runner of the previous release acts
    on over a connection of its own, which outlives its held session)."""
    try:
        async with connection.transaction():
            await connection.execute(f"SET LOCAL lock_timeout = {int(WAIT_SECONDS * 1000)}")
            await connection.execute(WAIT_FOR_RUN, lock)
            if settled is not None:
                await connection.execute(settled, *args)
            return await connection.fetchrow(sql, *args)
    except asyncpg.LockNotAvailableError as exc:
        raise RunBusy() from exc
