"""Postgres sessions that a silent server cannot hold: what the ingress, the
workers and the dead-letter store share (docs/design.md, "Exclusion").

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


@contextlib.asynccontextmanager
async def pooled(pool: asyncpg.Pool, timeout: float | None) -> AsyncIterator[asyncpg.Connection]:
    """A connection of `pool` for one piece of work (`timeout`: to acquire
    it). Left by a timeout, a cancellation or asyncpg's InterfaceError (a
    rollback refused while a statement is being cancelled), its session is
    closed rather than handed back: the release is then immediate."""
    async with pool.acquire(timeout=timeout) as connection:
        try:
            yield connection
        except (asyncio.TimeoutError, asyncio.CancelledError, asyncpg.InterfaceError):
            connection.terminate()
            raise


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
