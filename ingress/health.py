"""Liveness and readiness endpoints, and who may read /metrics.

/metrics shares the port the providers post to, and tells each source's
deliveries per status as they happen (a payment provider's volume minute by
minute), the dead letters open, the incidents: it answers only clients within
`WEBHOOK_INGEST_METRICS_ALLOWED_IPS` (by default loopback and the private
networks Prometheus scrapes from), the address found through trusted proxies.
Health and readiness say next to nothing and load balancers probe them from
anywhere: they stay open.
"""

from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

from webhook_ingest.ingress.publishing import outbox_key, publisher_key
from webhook_ingest.shared.observability import metrics

from .client_address import Network, is_within, parse_address
from .responses import error, json_response


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


def metrics_for(allowed: Sequence[Network]) -> Callable[[web.Request], Awaitable[web.Response]]:
    """`GET /metrics` for clients within `allowed`; 403 `forbidden_client_ip` to any other."""

    async def metrics_endpoint(request: web.Request) -> web.Response:
        if not is_within(parse_address(request.remote), allowed):
            return error(403, "forbidden_client_ip")
        return await metrics.endpoint(request)

    return metrics_endpoint
