"""The admin API's ordering keys (docs/reference.md §8; docs/design.md,
"Ordering keys"), and the ingress's ordering gauges.

    GET /admin/ordering/blocked?source=&limit=   lanes a dead letter blocks, oldest block first
    GET /admin/ordering/lanes/{lane}             one lane: holder, lease, block, its first rows

A lane is `SOURCE[#ROUTE]:VALUE`: in a path, its `#` (and any `/`, `?`,
`%` of the value) percent-encoded. Freeing a lane is its dead letter's
Replay or Discard (`/admin/dead-letters/{id}/…`).

The gauges (`webhook_ordering_*`, reference §10) are refreshed every 15 s
by one task of each ingress process from Postgres, as the dead-letter
gauge is: a Postgres outage leaves them stale, logged, never a dead task.
`webhook_ordering_unknown_lanes` reads the ingress's sources file: lanes
of a source or route it lacks wait for a worker that never comes.
"""

import asyncio
from collections.abc import AsyncIterator, Mapping

import asyncpg
from aiohttp import web

from webhook_ingest.ingress.appkeys import database_pool_key, sources_key
from webhook_ingest.ingress.responses import error
from webhook_ingest.shared.archive import InvalidFilter, parse_text
from webhook_ingest.shared.db import one_of, raise_if_cancelled
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.observability import get_logger, metrics
from webhook_ingest.shared.ordering import (
    blocked_document,
    blocked_lanes,
    lane_document,
    lane_state,
    waiting_by_source,
    waiting_lanes,
)
from webhook_ingest.shared.sources import Source

from .common import json_document

log = get_logger(__name__)

GAUGE_REFRESH_SECONDS = 15.0
DEFAULT_BLOCKED, MAX_BLOCKED = 100, 1000
ACQUIRE_TIMEOUT = 5.0


def add_ordering_routes(admin: web.Application) -> None:
    admin.router.add_get("/ordering/blocked", blocked_route)
    admin.router.add_get("/ordering/lanes/{lane:.+}", lane_route)


async def blocked_route(request: web.Request) -> web.Response:
    source = request.query.get("source") or None
    limit = request.query.get("limit")
    try:
        parse_text("source", source)  # a NUL: Postgres would refuse the query, which is no outage
    except InvalidFilter:
        return error(400, "invalid_source")
    if limit is not None and not (limit.isdigit() and 1 <= int(limit) <= MAX_BLOCKED):
        return error(400, "invalid_limit")
    async with one_of(request.config_dict[database_pool_key], ACQUIRE_TIMEOUT) as connection:
        lanes = await blocked_lanes(connection, source, int(limit) if limit else DEFAULT_BLOCKED)
    return json_document(200, [blocked_document(lane) for lane in lanes])


async def lane_route(request: web.Request) -> web.Response:
    lane = request.match_info["lane"]
    try:
        parse_text("lane", lane)
    except InvalidFilter:
        return error(400, "invalid_lane")
    async with one_of(request.config_dict[database_pool_key], ACQUIRE_TIMEOUT) as connection:
        state = await lane_state(connection, lane)
    if state is None:
        return error(404, "not_found")
    return json_document(200, lane_document(state))


# -- the gauges ----------------------------------------------------------------------


async def ordering_gauges_ctx(app: web.Application) -> AsyncIterator[None]:
    sources: dict[str, Source] = app[sources_key]
    task = asyncio.create_task(keep_ordering_gauges(app[database_pool_key], sources), name="ordering-gauges")
    yield
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def keep_ordering_gauges(
    pool: asyncpg.Pool, sources: Mapping[str, Source], every: float = GAUGE_REFRESH_SECONDS
) -> None:
    """Forever: the `webhook_ordering_*` gauges follow Postgres (a source with
    nothing left waiting or blocked goes to 0, its series kept)."""
    known: set[str] = set()
    while True:
        try:
            async with one_of(pool, ACQUIRE_TIMEOUT) as connection:
                by_source = await waiting_by_source(connection)
                by_route = await waiting_lanes(connection)
            known = set_gauges(by_source, known, unknown_lanes(by_route, sources))
        except Exception as exc:  # noqa: BLE001 - stale gauges, never a dead task
            raise_if_cancelled()
            log.warning("ordering_gauges_stale", error=describe(exc))
        await asyncio.sleep(every)


def unknown_lanes(by_route: Mapping[tuple[str, str], int], sources: Mapping[str, Source]) -> dict[str, int]:
    """Per source: its lanes with rows waiting whose source, or route, `sources` lacks
    (a worker with this sources file never takes them: workers/ordering/runner.py)."""
    unknown: dict[str, int] = {}
    for (name, route), lanes in by_route.items():
        source = sources.get(name)
        if source is None or (route and all(each.name != route for each in source.routes)):
            unknown[name] = unknown.get(name, 0) + lanes
    return unknown


def set_gauges(by_source: dict, known: set[str], unknown: Mapping[str, int] | None = None) -> set[str]:
    """The five gauges from `waiting_by_source` and `unknown_lanes`; `known`: the
    sources set before, each not in `by_source` now set to 0. The sources set now."""
    unknown = unknown or {}
    for source in known - by_source.keys():
        for gauge in _GAUGES:
            gauge.labels(source).set(0)
    for source, waiting in by_source.items():
        metrics.ordering_blocked_keys.labels(source).set(waiting.blocked)
        metrics.ordering_blocked_oldest.labels(source).set(waiting.blocked_oldest_seconds)
        metrics.ordering_waiting_events.labels(source).set(waiting.waiting)
        metrics.ordering_waiting_oldest.labels(source).set(waiting.oldest_seconds)
        metrics.ordering_unknown_lanes.labels(source).set(unknown.get(source, 0))
    return known | by_source.keys()


_GAUGES = (
    metrics.ordering_blocked_keys,
    metrics.ordering_blocked_oldest,
    metrics.ordering_waiting_events,
    metrics.ordering_waiting_oldest,
    metrics.ordering_unknown_lanes,
)
