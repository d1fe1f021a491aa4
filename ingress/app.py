"""The ingress application factory: routes in one place, resources owned by
`cleanup_ctx` (set up in order, torn down in reverse)."""

import asyncio
import signal
from collections.abc import AsyncIterator

from aiohttp import web

from webhook_ingest.ingress.admin import setup_admin, workers_watch_ctx
from webhook_ingest.ingress.intake import handler_args, ordered_intake_ctx, setup_limits, webhooks
from webhook_ingest.ingress.publishing import Publisher, publisher_key, relay_ctx
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.observability import get_logger, tracing
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources import Source

from . import health
from .appkeys import settings_key, sources_key
from .archive import archive_ctx
from .database import database_ctx
from .redis_client import done_markers_ctx, redis_ctx
from .server_log import drop_client_protocol_errors

log = get_logger(__name__)


def create_app(settings: Settings, sources: dict[str, Source], connection_name: str = "ingress") -> web.Application:
    app = web.Application(
        client_max_size=max(s.max_body_bytes for s in sources.values()) + 1,
        handler_args=handler_args(settings),
        middlewares=tracing.server_middlewares(),  # a request's span, when tracing is on
    )
    drop_client_protocol_errors()
    topology.set_event_queues(settings.event_queues)  # the process's one; its publishers hash to it
    app[settings_key] = settings
    app[sources_key] = sources
    app.cleanup_ctx.append(database_ctx)
    app.cleanup_ctx.append(workers_watch_ctx)
    app.cleanup_ctx.append(_publisher_ctx(connection_name))
    app.cleanup_ctx.append(relay_ctx)
    app.cleanup_ctx.append(ordered_intake_ctx)  # the pool's and the publisher's: its wake-ups end first
    app.cleanup_ctx.append(archive_ctx)  # after the pool's: its rows are flushed before the pool closes
    app.cleanup_ctx.append(redis_ctx)
    setup_limits(app, settings)
    app.cleanup_ctx.append(done_markers_ctx)
    setup_admin(app, settings)
    if settings.admin_token:  # the console (jinja2, aiohttp-session, cryptography) is imported only where it is on
        from webhook_ingest.ingress.console import setup_console

        setup_console(app, settings)
    app.router.add_post("/webhooks/{source}", webhooks.receive_webhook)
    app.router.add_get("/healthz", health.healthz)
    app.router.add_get("/readyz", health.readyz)
    app.router.add_get("/metrics", health.metrics_for(settings.metrics_allowed_ips))
    return app


def _publisher_ctx(connection_name: str):
    async def publisher_ctx(app: web.Application) -> AsyncIterator[None]:
        settings = app[settings_key]
        publisher = Publisher(
            settings.amqp_url,
            settings.namespace,
            settings.delivery_limit,
            connection_name,
            max_waiting=max(1, settings.max_concurrent_requests // 2),
        )
        publisher.start()
        app[publisher_key] = publisher
        yield
        await publisher.close()

    return publisher_ctx


async def stopping_once(app: web.Application) -> web.Application:
    """For `web.run_app(stopping_once(app), handle_signals=False)`: SIGINT or
    SIGTERM stops the ingress as aiohttp's own handlers do; another one
    while it stops is logged and ignored, not raised into its cleanup
    (docs/design.md, "Stopping")."""
    loop = asyncio.get_running_loop()
    stopping = False

    def stop(signum: signal.Signals) -> None:
        nonlocal stopping
        if stopping:
            log.info("ingress_already_stopping", signal=signum.name)
            return
        stopping = True
        raise web.GracefulExit()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop, signum)
    return app
