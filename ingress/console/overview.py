"""The overview's figures, from what the ingress can know: the queues'
depths (passive declares: nothing is created), the last hour from Postgres,
the outbox when its table exists, and each archived source's size on disk
as `webhook_archive_bytes` last read it (the process's archive upkeep reads
it every minute: no query of its own per view), and the workers as their
heartbeat rows say (shared/worker_heartbeats.py) with the last hour's
outcomes per minute they counted, drawn as a chart
(ingress/console/outcome_chart.py). A figure that cannot be had is None and
the page says "n/a" — the overview never fails because one service is away.
"""

import asyncio
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass

from webhook_ingest.shared.broker import queue_depths, topology
from webhook_ingest.shared.dead_letters import DeadLetterStore
from webhook_ingest.shared.sources import Source
from webhook_ingest.shared.worker_heartbeats import SILENT_AFTER_BEATS, HeartbeatStore

from .outcome_chart import Chart, chart


@dataclass(frozen=True)
class Overview:
    queues: list[tuple[str, int | None]]
    outcomes: dict[str, int] | None
    open_dead_letters: int | None
    outbox_pending: int | None
    archive_bytes: list[tuple[str, int | None]]  # each archived source's size; None: not measured yet
    workers: list[dict] | None  # each worker's last beat (shared/worker_heartbeats.py)
    outcomes_by_minute: Chart | None
    silent_after_beats: int = SILENT_AFTER_BEATS
    ordering_blocked: tuple[int, float] | None = None  # lanes blocked, oldest block's age (s); None: n/a
    ordered: bool = False  # a source (or route) has ordering keys: the line is shown


async def overview(
    store: DeadLetterStore,
    heartbeats: HeartbeatStore,
    amqp_url: str,
    namespace: str,
    sources: dict[str, Source],
    archive_sizes: Mapping[str, int],
    ordering: Awaitable[tuple[int, float] | None] | None = None,
) -> Overview:
    queues, database, workers, blocked = await asyncio.gather(
        queue_depths(amqp_url, queue_names(namespace, sources), "console-overview"),
        database_figures(store),
        worker_figures(heartbeats),
        ordering if ordering is not None else _none(),
    )
    archived = sorted(name for name, source in sources.items() if source.retention)
    outcomes, open_dead_letters, outbox_pending = database
    workers_seen, by_minute = workers
    return Overview(
        queues,
        outcomes,
        open_dead_letters,
        outbox_pending,
        [(name, archive_sizes.get(name)) for name in archived],
        workers_seen,
        by_minute,
        ordering_blocked=blocked,
        ordered=any(source.ordering or any(route.ordering for route in source.routes) for source in sources.values())
        or bool(blocked and blocked[0]),
    )


async def _none() -> None:
    return None


def queue_names(namespace: str, sources: dict[str, Source]) -> list[str]:
    delays = sorted({delay for source in sources.values() for delay in source.retry_delays})
    return [
        *topology.events_queues(namespace),
        *(topology.retry_queue(namespace, d, p) for d in delays for p in topology.partitions()),
        topology.dead_queue(namespace),
    ]


async def database_figures(store: DeadLetterStore) -> tuple[dict[str, int] | None, int | None, int | None]:
    """Outcomes in the last hour, open dead letters, outbox pending (None: no outbox table)."""
    try:
        return await store.overview()
    except Exception:  # noqa: BLE001 - Postgres away: the figures are n/a, the page still shows
        return None, None, None


async def worker_figures(heartbeats: HeartbeatStore) -> tuple[list[dict] | None, Chart | None]:
    """Each worker's last beat, and the last hour's outcomes per minute (None: Postgres away)."""
    try:
        return await heartbeats.workers(), chart(await heartbeats.outcomes_by_minute())
    except Exception:  # noqa: BLE001 - Postgres away: the figures are n/a, the page still shows
        return None, None
