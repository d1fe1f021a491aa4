"""The worker's `--metrics-port` server: /metrics, /healthz, /readyz."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web

from webhook_ingest.shared.observability import metrics


@asynccontextmanager
async def serve_health(worker, port: int, host: str = "0.0.0.0") -> AsyncIterator[None]:
    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        return web.json_response(
            {"status": "ready" if worker.ready else "starting"}, status=200 if worker.ready else 503
        )

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics.endpoint)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    try:
        yield
    finally:
        await runner.cleanup()
