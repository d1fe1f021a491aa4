"""The overview's figures, from what the ingress can know: the queues'
depths (passive declares: nothing is created), the last hour from Postgres,
the outbox when its table exists. A figure that cannot be had is None and
the page says "n/a" — the overview never fails because one service is away.
"""

import asyncio
from dataclasses import dataclass

from webhook_ingest.shared import topology
from webhook_ingest.shared.topology import queue_depths
from webhook_ingest.shared.dead_letter_store import DeadLetterStore
from webhook_ingest.shared.sources import Source

@dataclass(frozen=True)
class Overview:
    queues: list[tuple[str, int | None]]
    outcomes: dict[str, int] | None
    open_dead_letters: int | None
    outbox_pending: int | None


async def overview(store: DeadLetterStore, amqp_url: str, namespace: str, sources: dict[str, Source]) -> Overview:
    queues, database = await asyncio.gather(queue_depths(amqp_url, queue_names(namespace, sources), "console-overview"),
                                            database_figures(store))
    return Overview(queues, *database)


def queue_names(namespace: str, sources: dict[str, Source]) -> list[str]:
    delays = sorted({delay for source in sources.values() for delay in source.retry_delays})
    return [topology.events_queue(namespace), *(topology.retry_queue(namespace, d) for d in delays),
            topology.dead_queue(namespace)]


async def database_figures(store: DeadLetterStore) -> tuple[dict[str, int] | None, int | None, int | None]:
    """Outcomes in the last hour, open dead letters, outbox pending (None: no outbox table)."""
    try:
        return await store.overview()
    except Exception:  # noqa: BLE001 - Postgres away: the figures are n/a, the page still shows
        return None, None, None
