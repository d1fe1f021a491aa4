"""Postgres sessions that a silent server cannot hold: what the ingress, the
workers and the dead-letter store share (docs/design.md, "Sessions a silent
server cannot hold").

A server gone without a word — a failover that drops the old primary's
traffic, a partition past its keepalives — answers nothing and closes
nothing. asyncpg cancels a statement that timed out or was cancelled by
asking the server and waiting for its answer, and a pool's release waits for
that cancellation, then raises its own error in place of the cancellation.
So a session that leaves a piece of work that way is closed instead, and a
loop that outlives errors checks that it was not cancelled meanwhile.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg

CLOSE_SECONDS = 2.0  # a goodbye to each session; one that takes longer is dropped


# What may leave a statement unanswered on a silent server: its timeout, a
# cancellation, asyncpg's InterfaceError (a rollback refused while a
# statement is being cancelled).
UNANSWERED = (asyncio.TimeoutError, asyncio.CancelledError, asyncpg.InterfaceError)


@contextlib.asynccontextmanager
async def closed_if_left_by(
    connection: asyncpg.Connection, errors: tuple[type[BaseException], ...] = UNANSWERED
) -> AsyncIterator[None]:
    """Closes `connection`'s session when one of `errors` leaves the block,
    rather than cancelling its statement and waiting for an answer that may
    never come; a pool's release of it is then immediate."""
    try:
        yield
    except errors:
        terminate(connection)
        raise


def terminate(connection: asyncpg.Connection) -> None:
    """Its session closed at once; nothing when it is gone already. A pooled
    connection whose session was lost (ended by the server, cut) is detached
    from the caller's proxy, whose every call then raises InterfaceError: over
    the error that told of the loss, which is the one to report."""
    with contextlib.suppress(asyncpg.InterfaceError):
        connection.terminate()


@contextlib.asynccontextmanager
async def pooled(pool: asyncpg.Pool, timeout: float | None) -> AsyncIterator[asyncpg.Connection]:
    """A connection of `pool` for one piece of work (`timeout`: to acquire
    it), closed rather than handed back when anything in UNANSWERED leaves it."""
    async with pool.acquire(timeout=timeout) as connection, closed_if_left_by(connection):
        yield connection


@contextlib.asynccontextmanager
async def one_of(database: asyncpg.Pool | asyncpg.Connection, timeout: float) -> AsyncIterator[asyncpg.Connection]:
    """For a store over a pool (the ingress, workers) or one connection (the
    CLI): a pooled connection (`timeout` to acquire it), or that connection."""
    if isinstance(database, asyncpg.Pool):
        async with pooled(database, timeout) as connection:
            yield connection
    else:
        yield database


async def close_pool(pool: asyncpg.Pool, timeout: float = CLOSE_SECONDS) -> None:
    """Closes every session of `pool` politely within `timeout`, then drops
    those left: the process stops in time whatever the server does."""
    try:
        await asyncio.wait_for(pool.close(), timeout)
    except asyncio.TimeoutError:
        pool.terminate()


def raise_if_cancelled() -> None:
    """For a loop that outlives errors, in its `except`: the error may have
    replaced a cancellation on its way out (a pool's release after a
    cancelled statement), and the loop must still end."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
