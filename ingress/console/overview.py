"""The overview's figures, from what the ingress can know: the queues'
depths (passive declares: nothing is created), the last hour from Postgres,
the outbox when its table exists. A figure that cannot be had is None and
the page says "n/a" — the overview never fails because one service is away.
"""

import asyncio
import contextlib
from dataclasses import dataclass

import aio_pika

from webhook_ingest.shared import amqp, topology
from webhook_ingest.shared.dead_letter_store import DeadLetterStore
from webhook_ingest.shared.sources import Source

BROKER_TIMEOUT = 3.0


@dataclass(frozen=True)
class Overview:
    queues: list[tuple[str, int | None]]
    outcomes: dict[str, int] | None
    open_dead_letters: int | None
    outbox_pending: int | None


async def overview(store: DeadLetterStore, amqp_url: str, namespace: str, sources: dict[str, Source]) -> Overview:
    queues, database = await asyncio.gather(queue_depths(amqp_url, queue_names(namespace, sources)),
                                            database_figures(store))
    return Overview(queues, *database)


def queue_names(namespace: str, sources: dict[str, Source]) -> list[str]:
    delays = sorted({delay for source in sources.values() for delay in source.retry_delays})
    return [topology.events_queue(namespace), *(topology.retry_queue(namespace, d) for d in delays),
            topology.dead_queue(namespace)]


async def queue_depths(amqp_url: str, names: list[str]) -> list[tuple[str, int | None]]:
    """Each queue's ready messages; None when the broker is away or the queue
    does not exist yet. A connection of its own: a passive declare of a
    missing queue closes its channel, which must never be the ingress's."""
    depths: dict[str, int | None] = dict.fromkeys(names)
    with contextlib.suppress(Exception):  # noqa: BLE001 - the broker away: every depth n/a
        connection = await amqp.connect(amqp_url, timeout=BROKER_TIMEOUT,
                                        client_properties={"connection_name": "console-overview"})
        async with connection:
            for name in names:
                depths[name] = await _depth(connection, name)
    return list(depths.items())


async def _depth(connection, name: str) -> int | None:
    try:
        channel = await connection.channel()
        queue = await asyncio.wait_for(channel.declare_queue(name, passive=True), BROKER_TIMEOUT)
    except (aio_pika.exceptions.ChannelClosed, asyncio.TimeoutError):
        return None
    count = queue.declaration_result.message_count
    await channel.close()
    return count


async def database_figures(store: DeadLetterStore) -> tuple[dict[str, int] | None, int | None, int | None]:
    """Outcomes in the last hour, open dead letters, outbox pending (None: no outbox table)."""
    try:
        return await store.overview()
    except Exception:  # noqa: BLE001 - Postgres away: the figures are n/a, the page still shows
        return None, None, None
