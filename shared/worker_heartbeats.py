"""Workers report themselves (docs/design.md, "Workers report themselves"):
each worker process keeps a row in `worker_heartbeats` (who it is, last
seen, what it holds, degraded or not) and adds its outcomes to
`worker_minutes`, in one statement every `beat_seconds`
(workers/heartbeat.py). The ingress reads them for the console's overview
and its gauges (ingress/admin/workers.py); the admin API lists them.

A worker is *silent* when its last beat is older than SILENT_AFTER_BEATS of
its own intervals and it did not say it stopped: stopped or paused
(SIGSTOP, a frozen container), cut off from Postgres, or dead without a
word. Rows not seen for FORGET_SECONDS are deleted by the others' beats.
"""

import contextlib
from dataclasses import dataclass
from datetime import datetime

import asyncpg

from webhook_ingest.shared.db import load_queries, one_of

SQL = load_queries("webhook_ingest.shared", "worker_heartbeats.sql")

SILENT_AFTER_BEATS = 3
FORGET_SECONDS = 3600.0  # a worker stopped or silent this long leaves the list (and the gauge)
MINUTES_KEPT_SECONDS = 7200.0
RECENT_MINUTES = 15  # "lease losses and retries lately": this minute and the 14 before
CHART_MINUTES = 60
ACQUIRE_TIMEOUT = 5.0
STATEMENT_TIMEOUT = 5.0


@dataclass(frozen=True)
class Identity:
    name: str
    host: str
    pid: int
    started_at: datetime

    @property
    def worker_id(self) -> str:
        return f"{self.name}@{self.host}:{self.pid}"


@dataclass(frozen=True)
class Figures:
    """What a worker holds at one beat."""

    in_flight: int  # messages delivered, not yet settled
    keys_held: int  # keys it is running: each under its lease, or taking it
    pool_in_use: int  # the claim path's Postgres connections in use
    pool_size: int  # ... and their most
    degraded: bool  # Redis quorum lost: Postgres alone


@dataclass(frozen=True)
class Counts:
    """Outcomes since the last beat that was written."""

    processed: int = 0
    retried: int = 0
    dead: int = 0
    duplicate: int = 0
    lease_losses: int = 0

    def __sub__(self, other: "Counts") -> "Counts":
        return Counts(
            self.processed - other.processed,
            self.retried - other.retried,
            self.dead - other.dead,
            self.duplicate - other.duplicate,
            self.lease_losses - other.lease_losses,
        )


@dataclass(frozen=True)
class Glance:
    silent: int
    degraded: int


class HeartbeatStore:
    def __init__(self, database: asyncpg.Pool | asyncpg.Connection):
        self._database = database

    def _connection(self) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]:
        return one_of(self._database, ACQUIRE_TIMEOUT)

    async def beat(
        self, who: Identity, beat_seconds: float, figures: Figures, counts: Counts, stopped: bool = False
    ) -> None:
        async with self._connection() as connection:
            await connection.execute(
                SQL["worker_beat"],
                who.worker_id,
                who.name,
                who.host,
                who.pid,
                who.started_at,
                beat_seconds,
                stopped,
                figures.in_flight,
                figures.keys_held,
                figures.pool_in_use,
                figures.pool_size,
                figures.degraded,
                counts.processed,
                counts.retried,
                counts.dead,
                counts.duplicate,
                counts.lease_losses,
                FORGET_SECONDS,
                MINUTES_KEPT_SECONDS,
                timeout=STATEMENT_TIMEOUT,
            )

    async def workers(self) -> list[dict]:
        """Each worker seen in the last FORGET_SECONDS, live ones first (`workers_seen`)."""
        async with self._connection() as connection:
            rows = await connection.fetch(
                SQL["workers_seen"], SILENT_AFTER_BEATS, RECENT_MINUTES - 1, timeout=STATEMENT_TIMEOUT
            )
        return [dict(row) for row in rows]

    async def glance(self) -> Glance:
        async with self._connection() as connection:
            row = await connection.fetchrow(SQL["workers_at_a_glance"], SILENT_AFTER_BEATS, timeout=STATEMENT_TIMEOUT)
        return Glance(row["silent"], row["degraded"])

    async def outcomes_by_minute(self) -> list[dict]:
        """The last CHART_MINUTES minutes, oldest first, every worker's outcomes in each."""
        async with self._connection() as connection:
            rows = await connection.fetch(SQL["outcomes_by_minute"], CHART_MINUTES, timeout=STATEMENT_TIMEOUT)
        return [dict(row) for row in rows]
