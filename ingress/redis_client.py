"""The ingress's one Redis client, shared by everything in the process that
reads Redis (the duplicate fast path, the content bindings; a rate limiter may use it too).

It talks to the first master of `REDIS_URLS` only: what the ingress reads
there is a hint (a done marker), never a decision the Redlock quorum must
make. Short timeouts and no client-side retries, so a slow or absent Redis
costs a request at most one timeout and then the normal path.

The content bindings have a client of their own, with a longer timeout: a
binding given up on is not a shortcut lost but a replay let through
(docs/design.md, "Identity from what is signed").
"""

from collections.abc import AsyncIterator

import redis.asyncio as redis
from aiohttp import web
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from webhook_ingest.ingress.intake import (
    ContentBindings,
    DoneMarkers,
    connect_get,
    content_bindings_key,
    done_markers_key,
)

from .appkeys import redis_key, settings_key

TIMEOUT_SECONDS = 0.075  # a command's answer
CONNECT_TIMEOUT_SECONDS = 0.5  # a new pooled connection: rare, and slower on a busy machine
BINDING_TIMEOUT_SECONDS = 1.0  # the content binding's answer, and its connection


def connect(
    url: str, timeout: float = TIMEOUT_SECONDS, connect_timeout: float = CONNECT_TIMEOUT_SECONDS
) -> redis.Redis:
    return redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=connect_timeout,
        retry=Retry(NoBackoff(), 0),
    )


async def redis_ctx(app: web.Application) -> AsyncIterator[None]:
    """aiohttp cleanup_ctx: the client exists for the application's lifetime."""
    client = connect(app[settings_key].redis_urls[0])
    app[redis_key] = client
    yield
    await client.aclose()


async def done_markers_ctx(app: web.Application) -> AsyncIterator[None]:
    """The duplicate lookup: GETs pipelined on a connection of its own when
    the URL allows (`ingress.intake.redis_get`), else through the shared client; the
    content bindings' script through a client of its own (`BINDING_TIMEOUT_SECONDS`)."""
    settings = app[settings_key]
    pipeline = connect_get(settings.redis_urls[0], TIMEOUT_SECONDS, CONNECT_TIMEOUT_SECONDS)
    app[done_markers_key] = DoneMarkers(pipeline.get if pipeline else app[redis_key].get, settings.namespace)
    bindings = connect(settings.redis_urls[0], BINDING_TIMEOUT_SECONDS, BINDING_TIMEOUT_SECONDS)
    app[content_bindings_key] = ContentBindings(bindings, settings.namespace, settings.replay_window)
    yield
    if pipeline is not None:
        await pipeline.close()
    await bindings.aclose()
