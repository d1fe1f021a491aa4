"""The worker's heartbeat: a side task that writes its row every
`WEBHOOK_INGEST_HEARTBEAT_SECONDS` (shared/worker_heartbeats.py; docs/design.md,
"Workers report themselves").

It never touches the claim path: it runs on the bookkeeping pool (the
archive's), reads what the worker already keeps in memory (open deliveries,
keys led, pool sizes, the Redis degraded flag) and this process's
Prometheus counters, and sends one statement a beat. What the counters
moved since the last beat that was written goes into that beat's minute;
a beat that fails (Postgres away) is carried into the next one, so no
outcome is lost or counted twice. A worker that stops cleanly says so in
its last beat.
"""

import asyncio
import os
import socket
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime

from webhook_ingest.shared.db import raise_if_cancelled
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.observability import get_logger, metrics
from webhook_ingest.shared.worker_heartbeats import Counts, Figures, HeartbeatStore, Identity

log = get_logger(__name__)

LAST_BEAT_SECONDS = 2.0  # a stopping worker's last beat: within this, or the row turns silent instead


class Heartbeat:
    def __init__(self, store: HeartbeatStore, name: str, every: float, figures: Callable[[], Figures]):
        self._store = store
        self._every = every
        self._figures = figures
        self.identity = Identity(name, socket.gethostname(), os.getpid(), datetime.now(UTC))
        self._written = Counts()  # this process's counters at the last beat written
        self._failing = False

    async def run(self) -> None:
        """Forever; never raises (a beat missed is tried again the next interval)."""
        while True:
            await self.beat()
            await asyncio.sleep(self._every)

    async def stopped(self) -> None:
        """The last beat, once the worker drained: it stopped, it is not silent."""
        try:
            await asyncio.wait_for(self.beat(stopped=True), LAST_BEAT_SECONDS)
        except asyncio.TimeoutError:
            log.warning("worker_heartbeat_last_beat_late", seconds=LAST_BEAT_SECONDS)

    async def beat(self, stopped: bool = False) -> bool:
        counted = counted_so_far()
        try:
            await self._store.beat(self.identity, self._every, self._figures(), counted - self._written, stopped)
        except Exception as exc:  # noqa: BLE001 - silent on the overview meanwhile, never a dead task
            raise_if_cancelled()
            if not self._failing:
                log.warning("worker_heartbeat_failed", error=describe(exc))
            self._failing = True
            return False
        if self._failing:
            log.info("worker_heartbeat_written_again")
        self._written, self._failing = counted, False
        return True


def counted_so_far() -> Counts:
    """This process's outcomes and lease losses since it started, from its own metrics."""
    outcomes: Counter[str] = Counter()
    for metric in metrics.events.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                outcomes[sample.labels["outcome"]] += int(sample.value)
    lease_losses = sum(
        int(sample.value)
        for metric in metrics.handlers_cancelled.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    )
    return Counts(outcomes["processed"], outcomes["retried"], outcomes["dead"], outcomes["duplicate"], lease_losses)
