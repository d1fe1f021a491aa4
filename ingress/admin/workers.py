"""The workers as the ingress sees them (docs/design.md, "Workers report
themselves"): every `WEBHOOK_INGEST_HEARTBEAT_SECONDS` one query of the
workers' heartbeat rows sets `webhook_workers_silent` and
`webhook_workers_degraded` — read from memory by each scrape, never a query
per scrape. Postgres away: the gauges keep their last reading, logged once.

    GET /admin/workers   each worker seen in the last hour, live ones first
"""

import asyncio
from collections.abc import AsyncIterator

from aiohttp import web

from webhook_ingest.ingress.appkeys import database_pool_key, settings_key
from webhook_ingest.shared.db import raise_if_cancelled
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.observability import get_logger, metrics
from webhook_ingest.shared.worker_heartbeats import HeartbeatStore

from .common import json_document

log = get_logger(__name__)


async def keep_worker_gauges(store: HeartbeatStore, every: float) -> None:
    """Forever; never raises (a stale gauge, never a dead task)."""
    failing = False
    while True:
        try:
            glance = await store.glance()
        except Exception as exc:  # noqa: BLE001 - read again the next round
            raise_if_cancelled()
            if not failing:
                log.warning("workers_gauges_stale", error=describe(exc))
            failing = True
        else:
            metrics.workers_silent.set(glance.silent)
            metrics.workers_degraded.set(glance.degraded)
            failing = False
        await asyncio.sleep(every)


async def workers_watch_ctx(app: web.Application) -> AsyncIterator[None]:
    """aiohttp cleanup_ctx, after the database pool's."""
    store = HeartbeatStore(app[database_pool_key])
    task = asyncio.create_task(keep_worker_gauges(store, app[settings_key].heartbeat_seconds), name="workers-gauges")
    yield
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def add_worker_routes(admin: web.Application) -> None:
    admin.router.add_get("/workers", list_route)


async def list_route(request: web.Request) -> web.Response:
    return json_document(200, await HeartbeatStore(request.config_dict[database_pool_key]).workers())
