"""The ingress's one Postgres pool (`DATABASE_URL`, the workers' database),
shared by everything in the process that reads or writes Postgres: the
outbox and its relay, the admin API, the dead-letters gauge.

It starts empty (`min_size=0`), so an ingress whose Postgres is away at
start still starts and serves through the broker; connections are opened
when first needed, at most `WEBHOOK_INGEST_INGRESS_CONNECTIONS` (docs/operations.md,
"Postgres connections").
"""

from collections.abc import AsyncIterator

import asyncpg
from aiohttp import web

from webhook_ingest.shared.db import close_pool

from .appkeys import database_pool_key, settings_key

IDLE_SECONDS = 30.0  # the connections an outage's outbox inserts opened are closed soon after


async def database_ctx(app: web.Application) -> AsyncIterator[None]:
    """aiohttp cleanup_ctx: the pool exists for the application's lifetime."""
    settings = app[settings_key]
    pool = await asyncpg.create_pool(
        settings.database_url,
        min_size=0,
        max_size=settings.ingress_connections,
        max_inactive_connection_lifetime=IDLE_SECONDS,
    )
    app[database_pool_key] = pool
    yield
    await close_pool(pool)  # within 2 s, whatever the server does
