"""Liveness, readiness and metrics endpoints."""

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from webhook_ingest.ingress.appkeys import publisher_key
from webhook_ingest.ingress.responses import json_response


async def healthz(request: web.Request) -> web.Response:
    return json_response(200, {"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    if request.app[publisher_key].ready:
        return json_response(200, {"status": "ready"})
    return json_response(503, {"status": "broker_unavailable"})


async def metrics_endpoint(request: web.Request) -> web.Response:
    response = web.Response(body=generate_latest())
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response
