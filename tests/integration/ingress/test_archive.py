"""The ingress's part of the event archive (docs/design.md, "The archive"):
every request answered 200 is an arrival row — accepted through the broker
or the outbox, or answered as a duplicate — with its body, headers and
provider's event type, and the answer never waits on Postgres.
Real ingress app, RabbitMQ, Redis and Postgres; no worker runs."""

import json

import asyncpg
import pytest
import redis.asyncio as redis

from tests.conftest import REDIS_URL
from tests.support.broker import amqp_port
from tests.support.ingress import queued_events, running_ingress
from tests.support.processes import wait_until
from tests.support.signing import PROVIDER_SECRETS
from tests.support.tcpproxy import TcpProxy
from webhook_ingest.shared import signatures
from webhook_ingest.shared.redis_keys import done_marker, key_prefix
from webhook_ingest.shared.sources.model import load_sources

PROVIDERS = {  # source: (scheme, extra headers, body, the type the archive should say)
    "stripe": ("stripe", {}, {"id": "evt_1", "type": "invoice.paid", "customer": "cus_1"}, "invoice.paid"),
    "github": ("github", {"X-GitHub-Event": "push", "X-GitHub-Delivery": "d-1"}, {"ref": "main"}, "push"),
    "shopify": (
        "shopify",
        {"X-Shopify-Topic": "orders/create", "X-Shopify-Webhook-Id": "w-1"},
        {"id": 7},
        "orders/create",
    ),
    "standard": ("standard-webhooks", {}, {"type": "user.created", "data": {"id": 1}}, "user.created"),
}


@pytest.fixture
def sources(tmp_path):
    sections = [
        f'[sources.{name}]\nscheme = "{scheme}"\nsecrets = ["{PROVIDER_SECRETS[scheme]}"]\nhandler = "inbox"\n'
        for name, (scheme, *_) in PROVIDERS.items()
    ]
    sections.append(
        f'[sources.unkept]\nscheme = "hmac-sha256"\nsecrets = ["{PROVIDER_SECRETS["hmac-sha256"]}"]\n'
        'handler = "inbox"\nretention = "0d"\n'
    )
    path = tmp_path / "sources.toml"
    path.write_text("\n".join(sections))
    return load_sources(str(path))


def request_of(source: str, event_id: str = "evt_1") -> tuple[bytes, dict]:
    scheme, headers, payload, _ = PROVIDERS[source] if source in PROVIDERS else ("hmac-sha256", {}, {}, None)
    body = json.dumps({**payload, "id": event_id} if source in ("stripe", "unkept") else payload).encode()
    signed = signatures.sign(scheme, body, PROVIDER_SECRETS[scheme])
    return body, {**signed, **headers, **({"X-Event-ID": event_id} if scheme == "hmac-sha256" else {})}


async def rows(database_url: str) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetch("SELECT * FROM event_archive ORDER BY source, received_at")
    finally:
        await connection.close()


async def until_archived(database_url: str, count: int) -> list[asyncpg.Record]:
    async def archived():
        found = await rows(database_url)
        return found if len(found) >= count else None

    return await wait_until(archived, 30, message=f"{count} archived arrivals")


async def test_every_accepted_event_is_archived_as_received_with_its_providers_type(settings, sources):
    sent = {}
    async with running_ingress(settings, sources) as client:
        for source in PROVIDERS:
            body, headers = request_of(source)
            response = await client.post(f"/webhooks/{source}", data=body, headers=headers)
            assert response.status == 200, await response.text()
            sent[(await response.json())["key"]] = (source, body)
        archived = await until_archived(settings.database_url, len(PROVIDERS))
    queued = {event.key: event for event in await queued_events(settings.amqp_url, settings.namespace)}
    assert {row["key"] for row in archived} == set(sent) == set(queued)
    for row in archived:
        source, body = sent[row["key"]]
        assert (row["source"], bytes(row["body"]), row["status"]) == (source, body, "queued")
        assert row["event_type"] == PROVIDERS[source][3]
        assert row["received_at"].timestamp() == queued[row["key"]].received_at  # the message's own
        assert json.loads(row["headers"]) == queued[row["key"]].headers  # as the handler sees them
    [stripe] = [row for row in archived if row["source"] == "stripe"]
    assert "stripe-signature" in json.loads(stripe["headers"])  # provenance kept (docs/security.md)


async def test_a_source_with_retention_zero_is_not_archived(settings, sources):
    async with running_ingress(settings, sources) as client:
        for source in ("unkept", "github"):
            body, headers = request_of(source)
            assert (await client.post(f"/webhooks/{source}", data=body, headers=headers)).status == 200
        archived = await until_archived(settings.database_url, 1)
    assert [row["source"] for row in archived] == ["github"]


async def test_a_copy_answered_duplicate_is_an_arrival_of_its_own(settings, sources):
    body, headers = request_of("stripe")
    async with running_ingress(settings, sources) as client:
        first = await (await client.post("/webhooks/stripe", data=body, headers=headers)).json()
        [queued] = await queued_events(settings.amqp_url, settings.namespace)
        client_redis = redis.from_url(REDIS_URL)
        try:  # what a worker writes once the key completed
            await client_redis.set(key_prefix(settings.namespace) + first["key"], done_marker(queued.payload_sha256))
        finally:
            await client_redis.aclose()
        second = await (await client.post("/webhooks/stripe", data=body, headers=headers)).json()
        assert (first["status"], second["status"]) == ("accepted", "duplicate")
        archived = await until_archived(settings.database_url, 2)
    assert [(row["key"], row["status"]) for row in archived] == [
        ("stripe:evt_1", "queued"),
        ("stripe:evt_1", "duplicate"),
    ]
    assert bytes(archived[1]["body"]) == body


async def test_an_event_accepted_into_the_outbox_is_archived_too(settings, sources, monkeypatch):
    body, headers = request_of("github")
    with TcpProxy("127.0.0.1", amqp_port()) as proxy:
        monkeypatch.setenv("AMQP_URL", proxy.url_for(settings.amqp_url))
        async with running_ingress(type(settings)(), sources) as client:
            proxy.cut()
            response = await client.post("/webhooks/github", data=body, headers=headers)
            assert response.status == 200
            [row] = await until_archived(settings.database_url, 1)
    assert (row["key"], row["status"], bytes(row["body"]), row["event_type"]) == ("github:d-1", "queued", body, "push")


async def test_the_ingress_answers_while_postgres_is_cut_and_archives_once_it_is_back(settings, sources, monkeypatch):
    with TcpProxy("127.0.0.1", 5432) as postgres:
        monkeypatch.setenv("DATABASE_URL", postgres.url_for(settings.database_url))
        async with running_ingress(type(settings)(), sources) as client:
            await wait_until(lambda: _days_made(settings.database_url), 30, message="the archive's days made")
            postgres.cut()
            for n in range(5):
                body, headers = request_of("stripe", f"evt_{n}")
                response = await client.post("/webhooks/stripe", data=body, headers=headers)
                assert (response.status, (await response.json())["status"]) == (200, "accepted")
            assert await rows(settings.database_url) == []  # held by the ingress meanwhile
            postgres.restore()
            archived = await until_archived(settings.database_url, 5)
    assert sorted(row["event_id"] for row in archived) == [f"evt_{n}" for n in range(5)]


async def _days_made(database_url: str) -> bool:
    connection = await asyncpg.connect(database_url)
    try:
        return bool(
            await connection.fetchval("SELECT count(*) FROM pg_inherits WHERE inhparent = 'event_archive'::regclass")
        )
    finally:
        await connection.close()
