"""The console's Ordering page (docs/reference.md §8.1; docs/design.md,
"Ordering keys"): the ordering keys a dead letter blocks, oldest block
first, each linking the dead letter whose Replay (it runs again first,
then the rest) or Discard (the rest go on without it) frees the lane; and
the overview's line of them."""

import asyncpg
from aiohttp import web

from webhook_ingest.ingress.appkeys import database_pool_key
from webhook_ingest.shared.archive import InvalidFilter, parse_text
from webhook_ingest.shared.db import one_of
from webhook_ingest.shared.ordering import blocked_lanes, waiting_by_source

from .rendering import render

LISTED = 500  # blocked lanes a page shows
ACQUIRE_TIMEOUT = 5.0
routes = web.RouteTableDef()


def add_ordering_routes(console: web.Application) -> None:
    console.router.add_routes(routes)


@routes.get("/ordering")
async def ordering_page(request: web.Request) -> web.Response:
    source = request.query.get("source") or None
    try:
        parse_text("source", source)
    except InvalidFilter:
        source = None
    async with one_of(request.config_dict[database_pool_key], ACQUIRE_TIMEOUT) as connection:
        lanes = await blocked_lanes(connection, source, LISTED + 1)
    return await render(
        request,
        "ordering.html",
        {"lanes": lanes[:LISTED], "more": len(lanes) > LISTED, "source": source, "listed": LISTED},
    )


async def blocked_figures(pool: asyncpg.Pool) -> tuple[int, float] | None:
    """Lanes blocked over every source and the oldest block's age in seconds; None: Postgres away."""
    try:
        async with one_of(pool, ACQUIRE_TIMEOUT) as connection:
            by_source = await waiting_by_source(connection)
    except Exception:  # noqa: BLE001 - Postgres away: the figure is n/a, the page still shows
        return None
    blocked = sum(waiting.blocked for waiting in by_source.values())
    oldest = max((waiting.blocked_oldest_seconds for waiting in by_source.values() if waiting.blocked), default=0.0)
    return blocked, oldest
