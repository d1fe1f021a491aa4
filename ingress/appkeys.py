"""Typed keys of the ingress application's shared resources."""

import asyncpg
import redis.asyncio as redis
from aiohttp import web

from webhook_ingest.ingress.intake.content_bindings import ContentBindings
from webhook_ingest.ingress.intake.done_markers import DoneMarkers
from webhook_ingest.ingress.publishing.outbox import Outbox
from webhook_ingest.ingress.publishing.publisher import Publisher
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import Source

settings_key = web.AppKey("settings", Settings)
sources_key = web.AppKey("sources", dict[str, Source])
publisher_key = web.AppKey("publisher", Publisher)
redis_key = web.AppKey("redis", redis.Redis)  # one client per process: share it, do not open another
done_markers_key = web.AppKey("done_markers", DoneMarkers)
content_bindings_key = web.AppKey("content_bindings", ContentBindings)
database_pool_key = web.AppKey("database_pool", asyncpg.Pool)  # one pool per process: share it
outbox_key = web.AppKey("outbox", Outbox)
