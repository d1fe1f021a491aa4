"""A worker's side of paused sources (shared/sources/pauses.py; docs/reference.md §8.3).

`PausedSources` reads which sources are paused every second, so a pause or
a resume reaches every worker within about that. A delivery of a paused
source is parked: published to `NS.paused.<source>` (confirmed), then
acked — never run, and never holding a slot of the consumer's prefetch, so
a paused source's events do not block the others'. `move_back` returns a
resumed source's parked events to `NS.events`, oldest first, each
confirmed there before it is taken off its parking queue: a worker killed
midway leaves a copy at most, which the claim path settles as the copy it is.
"""

import asyncio
from collections.abc import Iterable

import asyncpg
from aio_pika.abc import AbstractChannel

from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.db import raise_if_cancelled
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.event import from_amqp
from webhook_ingest.shared.observability import get_logger
from webhook_ingest.shared.sources import PauseStore
from webhook_ingest.workers.claim import FailurePolicy

log = get_logger(__name__)

EVERY_SECONDS = 1.0
MOVE_BATCH = 100  # per source and round: one resumed source does not hold up the state refresh


class PausedSources:
    def __init__(self, pool: asyncpg.Pool):
        self._store = PauseStore(pool)
        self.names: frozenset[str] = frozenset()

    async def refresh(self) -> None:
        self.names = frozenset(await self._store.paused())

    def __contains__(self, source: str) -> bool:
        return source in self.names


class Parking:
    def __init__(self, channel: AbstractChannel, failures: FailurePolicy, namespace: str, sources: Iterable[str]):
        self._channel = channel  # for basic.get: a channel of its own, outside the consumer's acks
        self._failures = failures  # its confirm-mode publishes
        self._namespace = namespace
        self._sources = tuple(sources)

    async def declare(self) -> None:
        for source in self._sources:
            await topology.declare_paused_queue(self._channel, self._namespace, source)

    async def park(self, event) -> None:
        """`event` on its source's parking queue, confirmed; the caller acks the delivery after."""
        await self._failures.publish_to(event, topology.paused_queue(self._namespace, event.source))
        log.info("event_parked", source=event.source, key=event.key)

    async def move_back(self, paused: PausedSources) -> int:
        """Up to MOVE_BATCH parked events of each source not paused, back to NS.events (their keys' partitions)."""
        moved = 0
        for source in self._sources:
            if source in paused:
                continue
            queue = await self._channel.get_queue(topology.paused_queue(self._namespace, source), ensure=False)
            for _ in range(MOVE_BATCH):
                message = await queue.get(no_ack=False, fail=False)
                if message is None:
                    break
                if source in paused:  # paused again meanwhile: it stays parked
                    await message.nack(requeue=True)
                    break
                event = from_amqp(message.body, message.headers)
                await self._failures.publish_to(event, topology.events_queue_for(self._namespace, event.key))
                await message.ack()
                moved += 1
        if moved:
            log.info("parked_events_moved_back", count=moved)
        return moved


async def keep_pauses(paused: PausedSources, parking: Parking, every: float = EVERY_SECONDS) -> None:
    """Forever (each worker runs it): the paused set, and resumed sources'
    events moved back — two loops, so that a move waiting on the broker
    (an alarm blocks its publish for as long as it lasts) never holds a
    pause back, and a move sees a pause that lands midway. Postgres away:
    the last known set holds. The first move waits one round: a parking
    queue another worker declared a moment ago may not have its quorum
    process started yet, and RabbitMQ 3.10 answers a basic.get there with
    a connection-level INTERNAL_ERROR (`noproc`) that closes the worker's
    connection, so two workers started together on a new namespace could
    lose one (seen in the suite: a worker that never consumed)."""
    await asyncio.gather(
        _every(every, paused.refresh, "pause_refresh_failed"),
        _every(every, lambda: parking.move_back(paused), "parked_events_move_failed", first_after=every),
    )


async def _every(seconds: float, step, failure: str, first_after: float = 0.0) -> None:
    await asyncio.sleep(first_after)
    while True:
        try:
            await step()
        except Exception as exc:  # noqa: BLE001 - a late pause or resume, never a dead task
            raise_if_cancelled()
            log.warning(failure, error=describe(exc))
        await asyncio.sleep(seconds)
