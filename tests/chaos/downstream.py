"""The fault run's downstream: the external system the chaos handler calls,
as a real `forward` handler calls a payment API.

The handler (tests/chaos/handler.py) POSTs each run's body through the
built-in `forward` to `handler_options.downstream_url`, with the run's key
as `Idempotency-Key`, after its work and before its `ctx.db` effect. The
downstream, served by the run's own process, answers after the latency the
event's payload draws (`chaos.latency_ms`: a slow handler is a slow call),
and with a 500 to the first call of a key whose payload says
`chaos.fail_first_call` (a first attempt that fails downstream). It keeps
every call — key, the caller's pid and attempt, an ordered event's object and version, when it came and when it
was answered, the status — so the checks can count the successful calls of
each key: a real downstream took each of them, whether or not its caller
was still listening (tests/chaos/reruns.py).
"""

import asyncio
import dataclasses
import json
import os
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from aiohttp import web

from tests.support.tcpproxy import free_port
from webhook_ingest.workers.handlers.forward import handle as forward

SLOW_SHARE = 0.25  # of events whose call is slow: 300 ms to 2 s
FAIL_FIRST_CALL_SHARE = 0.08  # of events whose first call gets a 500


@dataclass(frozen=True)
class Call:
    key: str
    pid: int
    attempt: int
    started: float  # wall clock (time.time()), when the request came
    ended: float  # when it was answered
    status: int
    lane: str = ""  # an ordered run's (tests/chaos/ordering.py): its payload's `object`, and `version`
    version: int = 0

    @property
    def succeeded(self) -> bool:
        return self.status == 200


def call_directive(rng: random.Random, may_fail: bool = True) -> dict:
    """What an event's payload tells the downstream: its latency, and whether
    the key's first call fails (`may_fail`: not for an event whose handler
    already fails on purpose, whose failed call could be its last attempt)."""
    slow = rng.random() < SLOW_SHARE
    directive = {"latency_ms": rng.randint(300, 2000) if slow else rng.randint(5, 50)}
    if rng.random() < FAIL_FIRST_CALL_SHARE and may_fail:
        directive["fail_first_call"] = True
    return directive


@dataclass
class Downstream:
    url: str = ""
    calls: list[Call] = field(default_factory=list)
    received: Counter = field(default_factory=Counter)  # key -> requests come (answered or not yet)

    async def receive(self, request: web.Request) -> web.Response:
        started = time.time()
        key = request.headers["Idempotency-Key"]
        self.received[key] += 1
        first = self.received[key] == 1
        payload = _payload(await request.read())
        directive = payload.get("chaos") or {}
        await asyncio.sleep(directive.get("latency_ms", 10) / 1000)
        status = 500 if first and directive.get("fail_first_call") else 200
        self.calls.append(
            Call(
                key,
                int(request.query.get("pid", 0)),
                int(request.query.get("attempt", 0)),
                started,
                time.time(),
                status,
                str(payload.get("object", "")),
                int(payload.get("version", 0)),
            )
        )
        return web.Response(status=status, text="ok" if status == 200 else "injected failure")

    def successes(self) -> dict[str, list[Call]]:
        by_key: dict[str, list[Call]] = {}
        for call in sorted(self.calls, key=lambda call: call.started):
            if call.succeeded:
                by_key.setdefault(call.key, []).append(call)
        return by_key


def _payload(body: bytes) -> dict:
    try:
        payload = json.loads(body)
    except ValueError:
        return {}
    return payload if isinstance(payload, dict) else {}


@asynccontextmanager
async def serving() -> AsyncIterator[Downstream]:
    """A downstream on a free loopback port, in this process's loop. aiohttp
    does not cancel a handler whose client went away: a call whose caller
    was killed or stopped meanwhile is still answered, and counted."""
    downstream = Downstream()
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/calls", downstream.receive)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    downstream.url = f"http://127.0.0.1:{port}/calls"
    try:
        yield downstream
    finally:
        await runner.cleanup()


async def call(event, ctx) -> None:
    """The handler's external call, when the source names a downstream: the
    built-in `forward` (a non-2xx raises, so the run fails and is retried),
    its URL saying which process and attempt calls."""
    url = ctx.options.get("downstream_url")
    if url:
        options = {"url": f"{url}?pid={os.getpid()}&attempt={event.attempt}"}
        await forward(event, dataclasses.replace(ctx, options=options))
