"""`forward` against a real HTTP server: what each POST carries."""

from datetime import UTC, datetime

import pytest
from aiohttp import web

from webhook_ingest.workers.handlers import forward
from webhook_ingest.workers.handlers.interface import Event, HandlerContext


def event(source: str, event_id: str) -> Event:
    return Event(
        source=source,
        event_id=event_id,
        key=f"{source}:{event_id}",
        headers={"content-type": "application/json"},
        received_at=datetime.now(UTC),
        attempt=1,
        body=b'{"id": "%s"}' % event_id.encode(),
    )


@pytest.fixture
async def receiver(unused_tcp_port):
    """A downstream whose answers set a cookie (a load balancer's, an app's session)."""
    seen: list[dict[str, str]] = []

    async def receive(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        response = web.Response(status=200)
        response.set_cookie("session", f"for-{request.headers['X-Webhook-Source']}")
        return response

    app = web.Application()
    app.router.add_post("/hook", receive)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", unused_tcp_port).start()
    yield f"http://localhost:{unused_tcp_port}/hook", seen  # a name: aiohttp keeps no cookie of an IP address
    await forward.close_session()
    await runner.cleanup()


async def test_a_cookie_a_downstream_sets_is_never_sent_on_anyones_next_post(receiver):
    """Forward's session is the process's: a cookie kept from one source's
    downstream would go with every later POST to that host, another
    source's included. A webhook carries its own credentials (`headers`)."""
    url, seen = receiver
    await forward.handle(event("acme", "evt_1"), HandlerContext(db=None, options={"url": url}, logger=None))
    await forward.handle(event("globex", "evt_2"), HandlerContext(db=None, options={"url": url}, logger=None))
    assert [headers.get("Cookie") for headers in seen] == [None, None]
