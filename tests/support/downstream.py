"""A downstream for `forward`-like handlers: a local HTTP receiver that
answers 200 after a latency and counts, per Idempotency-Key, the POSTs it
received and those it answered (a payment API's successful calls)."""

import asyncio
import collections
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from aiohttp import web

from tests.support.tcpproxy import free_port

LATENCY = 0.3  # seconds it takes to answer, unless `?latency=` says otherwise


@dataclass
class Downstream:
    url: str = ""
    posts: collections.Counter[str] = field(default_factory=collections.Counter)
    answered: collections.Counter[str] = field(default_factory=collections.Counter)
    peak: int = 0  # the most POSTs in flight at once
    in_flight: int = 0

    async def receive(self, request: web.Request) -> web.Response:
        key = request.headers["Idempotency-Key"]
        self.posts[key] += 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(float(request.query.get("latency", LATENCY)))
        finally:
            self.in_flight -= 1
        self.answered[key] += 1  # the call succeeded, whether or not its caller still listens
        return web.Response(text="ok")


async def serving() -> AsyncIterator[Downstream]:
    downstream = Downstream()
    app = web.Application()
    app.router.add_post("/hook", downstream.receive)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    downstream.url = f"http://127.0.0.1:{port}/hook"
    try:
        yield downstream
    finally:
        await runner.cleanup()
