"""The ingress at its edges: odd but valid input, and a broker that does not
take the message. A 200 is never sent for an event that is not stored."""

import asyncio
import json
from collections import Counter

import aio_pika
import asyncpg
import pytest

from webhook_ingest.shared import signatures, topology
from webhook_ingest.shared.message import from_amqp
from webhook_ingest.shared.sources import load_sources
from tests.support.ingress import running_ingress

SECRET = "edge-secret"


@pytest.fixture
def sources(tmp_path):
    path = tmp_path / "sources.toml"
    path.write_text(f'[sources.edge]\nscheme = "hmac-sha256"\nsecrets = ["{SECRET}"]\nhandler = "inbox"\n')
    return load_sources(str(path))


def signed(body: bytes, event_id: str | None = None) -> dict:
    headers = signatures.sign("hmac-sha256", body, SECRET)
    return {**headers, "X-Event-ID": event_id} if event_id else headers


async def post(client, body: bytes, event_id: str | None = None) -> tuple[int, dict]:
    response = await client.post("/webhooks/edge", data=body, headers=signed(body, event_id))
    return response.status, await response.json()


async def stored_copies(settings) -> Counter:
    """Key -> copies on the events queue (if it exists) or in the outbox table (if there is one)."""
    return await _queued_keys(settings) + await _outbox_keys(settings.database_url)


async def _queued_keys(settings) -> Counter:
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        try:
            queue = await channel.declare_queue(topology.events_queue(settings.namespace), passive=True)
        except aio_pika.exceptions.ChannelNotFoundEntity:
            return Counter()
        keys = Counter()
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            keys[from_amqp(message.body, message.headers).key] += 1
        return keys


async def _outbox_keys(database_url: str) -> Counter:
    connection = await asyncpg.connect(database_url)
    try:
        if await connection.fetchval("SELECT to_regclass('outbox')") is None:
            return Counter()
        return Counter(row["key"] for row in await connection.fetch("SELECT key FROM outbox"))
    finally:
        await connection.close()


async def delete_events_queue(settings) -> None:
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(topology.events_queue(settings.namespace))


async def test_an_unroutable_publish_is_never_answered_200(settings, sources):
    """The events queue deleted under a running ingress: the broker returns
    every publish. Copies of one key published at once must each learn it."""
    async with running_ingress(settings, sources) as client:
        await delete_events_queue(settings)
        bodies = [json.dumps({"id": f"e{n}"}).encode() for n in range(8)]
        answers = await asyncio.gather(*(post(client, body) for body in bodies for _copy in range(3)))
    accepted = Counter(answer["key"] for status, answer in answers if status == 200)
    assert {status for status, _ in answers} <= {200, 503}
    assert accepted <= await stored_copies(settings)  # every 200 is a copy stored


UNSTORABLE_BODIES = {
    "lone surrogate": rb'{"id":"e1","t":"\ud83d"}',
    "NUL escape": rb'{"id":"e2","t":"a\u0000b"}',
    "beyond float": b'{"id":"e3","n":1e400}',
    "beyond float, negative": b'{"id":"e4","n":-1e400}',
    "beyond numeric scale": b'{"id":"e5","n":1e-16384}',
    "NaN": b'{"id":"e6","n":NaN}',
    "UTF-16": '{"id":"e7"}'.encode("utf-16"),
    "nested too deeply": b'{"id":"e8","a":' + b"[" * 5000 + b"]" * 5000 + b"}",
}


async def test_json_that_postgres_cannot_store_is_refused_at_the_door(settings, sources):
    async with running_ingress(settings, sources) as client:
        for case, body in UNSTORABLE_BODIES.items():
            assert await post(client, body) == (400, {"error": "invalid_json"}), case
        assert (await post(client, rb'{"id":"ok","t":"\ud83d\ude00","n":1e308}'))[0] == 200
    assert await stored_copies(settings) == {"edge:ok": 1}
