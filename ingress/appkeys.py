"""Typed keys of the ingress application's shared resources. A resource of
one package (the publisher, the outbox, the done markers) has its key there,
beside its class: this module imports no package of the ingress."""

import asyncpg
import redis.asyncio as redis
from aiohttp import web

from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources import Source

settings_key = web.AppKey("settings", Settings)
sources_key = web.AppKey("sources", dict[str, Source])
redis_key = web.AppKey("redis", redis.Redis)  # the hints' client (ingress/redis_client.py): share it
database_pool_key = web.AppKey("database_pool", asyncpg.Pool)  # one pool per process: share it
