"""The ingress answers `duplicate` for a copy of a completed event, from the
done marker the workers write, and takes the normal path whenever unsure."""

import asyncio
import json
import subprocess

import pytest

from tests.support.ingress import queued_events, running_ingress
from tests.support.processes import wait_until
from tests.support.signing import PROVIDER_SECRETS
from tests.support.tcpproxy import TcpProxy, free_port
from webhook_ingest.shared import signatures
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources
from webhook_ingest.workers.claim.idempotency import IdempotencyStore

SECRET = PROVIDER_SECRETS["hmac-sha256"]


@pytest.fixture
def sources(tmp_path):
    path = tmp_path / "sources.toml"
    path.write_text(f'[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["{SECRET}"]\nhandler = "inbox"\n')
    return load_sources(str(path))


def signed(body: dict) -> tuple[bytes, dict]:
    raw = json.dumps(body).encode()
    return raw, signatures.sign("hmac-sha256", raw, SECRET)


async def complete_as_a_worker_would(settings: Settings, event) -> None:
    store = IdempotencyStore(settings.redis_urls, settings.namespace, settings.lock_ttl, settings.done_ttl)
    try:
        await store.complete(event.key, event.payload_sha256)
    finally:
        await store.close()


async def post(client, body: dict) -> tuple[int, dict]:
    raw, headers = signed(body)
    response = await client.post("/webhooks/acme", data=raw, headers=headers)
    return response.status, await response.json()


async def test_a_copy_of_a_completed_event_is_a_duplicate_and_nothing_is_queued(settings, sources):
    event_body = {"id": "evt_1", "amount": 10}
    async with running_ingress(settings, sources) as client:
        assert await post(client, event_body) == (200, {"status": "accepted", "key": "acme:evt_1"})
        [first] = await queued_events(settings.amqp_url, settings.namespace)
        await complete_as_a_worker_would(settings, first)
        assert await post(client, event_body) == (200, {"status": "duplicate", "key": "acme:evt_1"})
    assert await queued_events(settings.amqp_url, settings.namespace) == []


async def test_the_same_key_with_another_payload_is_queued_for_the_workers_to_record(settings, sources):
    async with running_ingress(settings, sources) as client:
        await post(client, {"id": "evt_1", "amount": 10})
        [first] = await queued_events(settings.amqp_url, settings.namespace)
        await complete_as_a_worker_would(settings, first)
        assert await post(client, {"id": "evt_1", "amount": 99}) == (200, {"status": "accepted", "key": "acme:evt_1"})
    [conflicting] = await queued_events(settings.amqp_url, settings.namespace)
    assert conflicting.payload_sha256 != first.payload_sha256


async def test_with_redis_unreachable_a_copy_is_accepted_and_queued(settings, sources, monkeypatch):
    host, port = settings.redis_urls[0].split("//", 1)[1].split("/", 1)[0].split(":")
    with TcpProxy(host, int(port)) as proxy:
        monkeypatch.setenv("REDIS_URLS", proxy.url_for(settings.redis_urls[0]))
        behind_proxy = Settings()
        event_body = {"id": "evt_1", "amount": 10}
        async with running_ingress(behind_proxy, sources) as client:
            await post(client, event_body)
            [first] = await queued_events(settings.amqp_url, settings.namespace)
            await complete_as_a_worker_would(settings, first)
            proxy.cut()
            assert await post(client, event_body) == (200, {"status": "accepted", "key": "acme:evt_1"})
    [copy] = await queued_events(settings.amqp_url, settings.namespace)
    assert copy.key == "acme:evt_1"


async def test_a_redis_with_a_password_and_a_database_number_is_read_where_the_workers_write(
    settings, sources, monkeypatch, tmp_path
):
    port = free_port()
    server = subprocess.Popen(  # noqa: ASYNC220 - starting it is instant; the test waits for its port
        [
            "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--requirepass",
            "s3cret",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await wait_until(lambda: _accepts_connections(port), 10, interval=0.05, message="redis-server up")
        monkeypatch.setenv("REDIS_URLS", f"redis://:s3cret@127.0.0.1:{port}/3")
        private = Settings()
        event_body = {"id": "evt_1", "amount": 10}
        async with running_ingress(private, sources) as client:
            await post(client, event_body)
            [first] = await queued_events(settings.amqp_url, settings.namespace)
            await complete_as_a_worker_would(private, first)
            assert await post(client, event_body) == (200, {"status": "duplicate", "key": "acme:evt_1"})
    finally:
        server.kill()
        server.wait()


async def _accepts_connections(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    return True
