"""Incident notifications (issue 25, item 2) against local receivers that
record what they got: one message per opening, reopening and resolution,
none for an acknowledgement, a failing receiver tried again without the
others getting a second copy, the JSON webhook verified with the Standard
Webhooks library."""

import asyncio
import base64

import aiohttp
import asyncpg
import orjson
import pytest
import standardwebhooks
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.support.events import make_event
from webhook_ingest.shared.incidents.store import IncidentStore
from webhook_ingest.shared.sources.model import parse_source
from webhook_ingest.workers.claim.retry import FailurePolicy
from webhook_ingest.workers.failures.notifications import Notifier, signed_webhook, slack

SECRET = "whsec_" + base64.b64encode(b"notification-secret-0123456789").decode()


class Receiver:
    """An HTTP endpoint that records each POST, answering `statuses` in turn
    (then 200); `slow` types are recorded 0.3 s after they arrive, as a
    receiver that takes its time to process them does."""

    def __init__(self, *statuses: int, slow: tuple[str, ...] = ()):
        self.statuses = list(statuses)
        self.slow = slow
        self.received: list[tuple[dict, bytes]] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if orjson.loads(body).get("type") in self.slow:
            await asyncio.sleep(0.3)
        self.received.append((dict(request.headers), body))
        return web.Response(status=self.statuses.pop(0) if self.statuses else 200)


@pytest.fixture
async def receivers():
    started = []

    async def start(*statuses: int, slow: tuple[str, ...] = ()) -> tuple[Receiver, str]:
        receiver = Receiver(*statuses, slow=slow)
        app = web.Application()
        app.router.add_post("/hook", receiver.handle)
        server = TestServer(app)
        await server.start_server()
        started.append(server)
        return receiver, str(server.make_url("/hook"))

    yield start
    for server in started:
        await server.close()


@pytest.fixture
async def pool(settings):
    pool = await asyncpg.create_pool(settings.database_url, min_size=0, max_size=2)
    yield pool
    await pool.close()


async def fail_once(settings, pool, event_id: str, message: str) -> None:
    source = parse_source("acme", {"scheme": "github", "secrets": ["s"], "handler": "inbox", "max_attempts": 1})
    await FailurePolicy(None, pool, settings.namespace).fail(
        make_event("acme", event_id), source, RuntimeError(message)
    )


async def test_each_change_but_acknowledgement_is_sent_once_to_each_target(settings, pool, receivers):
    slack_receiver, slack_url = await receivers()
    webhook_receiver, webhook_url = await receivers(500)  # fails once
    notifier = Notifier(pool, {"slack": slack(slack_url), "webhook": signed_webhook(webhook_url, SECRET)})
    store = IncidentStore(pool)
    async with aiohttp.ClientSession() as session:
        await fail_once(settings, pool, "evt_1", "downstream answered 503")
        assert await notifier.send_due(session) == 1
        assert len(slack_receiver.received) == 1 and len(webhook_receiver.received) == 1  # the 500
        async with pool.acquire() as connection:  # its backoff over
            await connection.execute("UPDATE incident_changes SET claimed_until = '-infinity'")
        assert await notifier.send_due(session) == 1
        assert len(slack_receiver.received) == 1, "Slack got it already: not sent again"
        assert len(webhook_receiver.received) == 2
        assert await notifier.send_due(session) == 0

        [incident] = await store.newest_first()
        await store.acknowledge(incident["id"], "operator:alice")
        await store.resolve(incident["id"], "operator:alice")
        await fail_once(settings, pool, "evt_2", "downstream answered 502")  # reopens it
        assert await notifier.send_due(session) == 2
        assert await notifier.send_due(session) == 0

    texts = [orjson.loads(body)["text"] for _, body in slack_receiver.received]
    assert [text.split(" — ")[0] for text in texts] == [
        f":rotating_light: Incident {incident['id']} opened",
        f":white_check_mark: Incident {incident['id']} resolved by operator:alice",
        f":rotating_light: Incident {incident['id']} reopened",
    ]
    assert "acme / inbox: RuntimeError: downstream answered &lt;n&gt;" in texts[0]  # Slack shows <n>

    verifier = standardwebhooks.Webhook(SECRET)
    documents = [verifier.verify(body, headers) for headers, body in webhook_receiver.received]
    assert [document["type"] for document in documents] == [
        "incident.opened",
        "incident.opened",
        "incident.resolved",
        "incident.reopened",
    ]
    assert documents[0]["data"]["id"] == incident["id"] and documents[0]["data"]["error_type"] == "RuntimeError"
    ids = [headers["webhook-id"] for headers, _ in webhook_receiver.received]
    assert ids[0] == ids[1] and len(set(ids)) == 3  # the retried one keeps its id: a receiver can tell


async def test_an_incidents_changes_reach_a_receiver_in_the_order_they_happened(settings, pool, receivers):
    """An incident resolved and reopened before the notifier's next round:
    a receiver that applies what it gets in turn must end with the incident
    open, so it must get `resolved` before `reopened` — even when it takes
    longer over the first."""
    webhook_receiver, webhook_url = await receivers(slow=("incident.resolved",))
    notifier = Notifier(pool, {"webhook": signed_webhook(webhook_url, SECRET)})
    store = IncidentStore(pool)
    async with aiohttp.ClientSession() as session:
        await fail_once(settings, pool, "evt_1", "downstream answered 503")
        assert await notifier.send_due(session) == 1
        [incident] = await store.newest_first()
        await store.resolve(incident["id"], "operator:alice")
        await fail_once(settings, pool, "evt_2", "downstream answered 502")  # reopens it
        assert await notifier.send_due(session) == 2
    verifier = standardwebhooks.Webhook(SECRET)
    types = [verifier.verify(body, headers)["type"] for headers, body in webhook_receiver.received]
    assert types == ["incident.opened", "incident.resolved", "incident.reopened"]


async def test_a_change_that_failed_holds_back_its_incidents_later_changes(settings, pool, receivers):
    """The receiver refuses `resolved` once: `reopened` must not overtake it
    while it waits for its retry; once the retry is due both go, in order."""
    webhook_receiver, webhook_url = await receivers(200, 500)
    notifier = Notifier(pool, {"webhook": signed_webhook(webhook_url, SECRET)})
    store = IncidentStore(pool)
    async with aiohttp.ClientSession() as session:
        await fail_once(settings, pool, "evt_1", "downstream answered 503")
        assert await notifier.send_due(session) == 1
        [incident] = await store.newest_first()
        await store.resolve(incident["id"], "operator:alice")
        assert await notifier.send_due(session) == 1  # refused: waits out its backoff
        await fail_once(settings, pool, "evt_2", "downstream answered 502")  # reopens it
        await notifier.send_due(session)  # the reopening waits behind the resolution
        async with pool.acquire() as connection:  # the backoff over
            await connection.execute("UPDATE incident_changes SET claimed_until = '-infinity'")
        assert await notifier.send_due(session) == 2
        assert await notifier.send_due(session) == 0
    verifier = standardwebhooks.Webhook(SECRET)
    types = [verifier.verify(body, headers)["type"] for headers, body in webhook_receiver.received]
    assert types == ["incident.opened", "incident.resolved", "incident.resolved", "incident.reopened"]


async def test_an_error_text_reaches_slack_as_text_not_markup(settings, pool, receivers):
    """An error message holds text a sender or a downstream chose (a
    payload's value, a receiver's answer). Slack reads `<!channel>` as a
    mention of everyone and `<https://…|text>` as a link under any words:
    the message must show them as typed (`&`, `<`, `>` escaped, as Slack
    asks), never ping anyone nor hide a link."""
    slack_receiver, slack_url = await receivers()
    notifier = Notifier(pool, {"slack": slack(slack_url)})
    await fail_once(settings, pool, "evt_1", "downstream said <!channel> run <https://evil.example|the fix> & wait")
    async with aiohttp.ClientSession() as session:
        assert await notifier.send_due(session) == 1
    [text] = [orjson.loads(body)["text"] for _, body in slack_receiver.received]
    assert "<!channel>" not in text and "<https://" not in text
    assert "said &lt;!channel&gt; run &lt;&lt;url&gt; fix&gt; &amp; wait" in text  # the URL masked in the pattern


async def test_with_no_target_due_changes_are_dropped_not_kept_for_later(settings, pool, receivers):
    await fail_once(settings, pool, "evt_1", "boom")
    async with aiohttp.ClientSession() as session:
        assert await Notifier(pool, {}).send_due(session) == 1
        receiver, url = await receivers()
        assert await Notifier(pool, {"slack": slack(url)}).send_due(session) == 0
    assert receiver.received == []
