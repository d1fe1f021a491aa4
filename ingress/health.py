"""Liveness and readiness endpoints (/metrics is `shared.metrics.endpoint`)."""

from aiohttp import web

from webhook_ingest.ingress.appkeys import outbox_key, publisher_key
from webhook_ingest.ingress.responses import json_response


async def healthz(request: web.Request) -> web.Response:
    return json_response(200, {"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """200 while the ingress can accept by either path: the broker confirms,
    or (RabbitMQ away) the outbox takes inserts; 503 when neither does."""
    if request.app[publisher_key].available:
        return json_response(200, {"status": "ready", "via": "broker"})
    if await request.app[outbox_key].writable():
        return json_response(200, {"status": "ready", "via": "outbox"})
    return json_response(503, {"status": "unavailable"})
