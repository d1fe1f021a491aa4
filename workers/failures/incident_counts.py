"""Retries counted in their incidents behind the runs' backs.

A retry's count is bookkeeping, not part of the run: it used to be written
inside the run, on one of the claim path's statement connections, and a
count that met its incident's row held elsewhere (every worker counts the
same incident during an outage) held the run and that connection, then was
skipped. `note` now only queues it; one task writes the counts in order,
on the worker's bookkeeping pool, waiting while the row is busy or
Postgres away, so a count arrives late rather than never, and nothing a
run waits for shares a connection with it (docs/design.md, "The claim path
owns its resources"). A dead letter's count is still written with the dead
letter, in its transaction (`workers.claim.retry`). What is queued when the
worker is killed is lost: a count short, as before, never an event.
"""

import asyncio
import time
from collections import deque

import asyncpg

from webhook_ingest.shared.archive import is_outage
from webhook_ingest.shared.backoff import pauses
from webhook_ingest.shared.db import pooled
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.incidents import Failure, record_failure
from webhook_ingest.shared.observability import get_logger

log = get_logger(__name__)

MAX_HELD = 10_000  # counts waiting while Postgres is away; past it, new ones are dropped
STATEMENT_SECONDS = 5.0
LOG_EVERY_SECONDS = 10.0


class IncidentCounts:
    def __init__(self, pool: asyncpg.Pool):
        self._pool = pool
        self._held: deque[Failure] = deque()
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self._dropped = 0
        self._dropped_logged_at = 0.0

    def note(self, failure: Failure) -> None:
        """Queues `failure`'s count; never waits."""
        if len(self._held) >= MAX_HELD:
            self._dropped += 1
            if time.monotonic() - self._dropped_logged_at >= LOG_EVERY_SECONDS:
                log.warning("incident_counts_dropped", dropped=self._dropped, held=len(self._held))
                self._dropped, self._dropped_logged_at = 0, time.monotonic()
            return
        self._held.append(failure)
        self._drained.clear()
        self._wake.set()

    async def run(self) -> None:
        """Forever: writes each count in turn, waiting while its row is busy or Postgres away."""
        while True:
            await self._wake.wait()
            backoff = pauses(0.2, 5.0)
            while self._held:
                try:
                    await self._write(self._held[0])
                except Exception as exc:  # noqa: BLE001 - a busy row or an outage: the same count again, later
                    if not is_outage(exc):
                        log.warning("incident_count_skipped", error=describe(exc))
                    else:
                        await asyncio.sleep(next(backoff))
                        continue
                self._held.popleft()
                backoff = pauses(0.2, 5.0)
            self._wake.clear()
            self._drained.set()

    async def flush(self, timeout: float) -> None:
        """Until every count noted is written, for `timeout` at most (a worker stopping)."""
        try:
            await asyncio.wait_for(self._drained.wait(), timeout)
        except TimeoutError:
            log.warning("incident_counts_left", held=len(self._held))

    async def _write(self, failure: Failure) -> None:
        async with pooled(self._pool, STATEMENT_SECONDS) as connection, connection.transaction():
            await record_failure(connection, failure, timeout=STATEMENT_SECONDS)
