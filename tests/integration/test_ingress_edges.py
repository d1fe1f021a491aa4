"""The ingress at its edges: odd but valid input, and a broker that does not
take the message. A 200 is never sent for an event that is not stored."""

import asyncio
import json
from collections import Counter

import aio_pika
import asyncpg
import pytest

from tests.support.events import make_event
from tests.support.ingress import queued_events, running_ingress
from tests.support.processes import wait_until
from webhook_ingest.ingress.publishing.outbox import QUERIES as OUTBOX_SQL
from webhook_ingest.ingress.publishing.outbox import outbox_columns, outbox_row
from webhook_ingest.shared import signatures
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.event.message import from_amqp
from webhook_ingest.shared.sources.model import load_sources

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


async def raw_post(client, path: str, body: bytes, headers: list[tuple[bytes, bytes]]) -> tuple[int, dict]:
    """One HTTP/1.1 request written byte for byte (aiohttp's client would not send obs-text)."""
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    try:
        head = [
            f"POST {path} HTTP/1.1".encode(),
            b"Host: x",
            b"Connection: close",
            b"Content-Length: " + str(len(body)).encode(),
            *(name + b": " + value for name, value in headers),
        ]
        writer.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        response = await reader.read()
    finally:
        writer.close()
    status_line, _, rest = response.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


async def test_a_header_byte_that_is_not_utf8_is_escaped_never_a_5xx(settings, sources):
    """obs-text (bytes 0x80-0xff that are not UTF-8) is allowed in a header
    value; it reaches the handler escaped as the text \\xNN."""
    body = json.dumps({"id": "latin1"}).encode()
    signature = [(name.encode(), value.encode()) for name, value in signed(body).items()]
    async with running_ingress(settings, sources) as client:
        in_provider_header = await raw_post(
            client, "/webhooks/edge", body, [*signature, (b"X-Note", b"caf\xe9 \xc3\xa9")]
        )
        no_body_id = json.dumps({"type": "latin1"}).encode()
        in_event_id = await raw_post(
            client, "/webhooks/edge", no_body_id, [*signature_for(no_body_id), (b"X-Event-ID", b"id-\xff")]
        )
    assert in_provider_header == (200, {"status": "accepted", "key": "edge:latin1"})
    assert in_event_id == (200, {"status": "accepted", "key": "edge:id-\\xff"})
    [first, second] = sorted(await queued_events(settings.amqp_url, settings.namespace), key=lambda e: e.key)
    assert second.headers["x-note"] == "caf\\xe9 é"
    assert first.key == "edge:id-\\xff" and first.event_id == "id-\\xff"


def signature_for(body: bytes) -> list[tuple[bytes, bytes]]:
    return [(name.encode(), value.encode()) for name, value in signed(body).items()]


async def test_what_would_not_fit_an_amqp_frame_is_refused_and_the_ingress_keeps_publishing(settings, sources):
    """Headers of 320 KB made the broker close the ingress's connection (a
    frame over frame_max); from the outbox the event did it again at every
    relay attempt. Too much header, or too long an event id, is a 4xx now."""
    body = json.dumps({"id": "big"}).encode()
    padding = [(f"X-Pad-{n}".encode(), b"v" * 8000) for n in range(40)]
    long_id_in_body = json.dumps({"id": "i" * 200_000}).encode()
    async with running_ingress(settings, sources) as client:
        assert await raw_post(client, "/webhooks/edge", body, [*signature_for(body), *padding]) == (
            431,
            {"error": "headers_too_large"},
        )
        assert await post(client, long_id_in_body) == (400, {"error": "invalid_event_id"})
        no_id = json.dumps({"size": "big"}).encode()  # X-Event-ID is read only when the signed body has no id
        assert await post(client, no_id, event_id="h" * 1025) == (400, {"error": "invalid_event_id"})
        assert (await post(client, no_id, event_id="h" * 1024))[0] == 200
        assert (await post(client, json.dumps({"id": "next"}).encode()))[0] == 200
    assert await _queued_keys(settings) == {"edge:" + "h" * 1024: 1, "edge:next": 1}  # none in the outbox


async def test_a_body_that_cannot_be_decoded_is_a_400_not_a_500(settings, sources):
    """aiohttp decodes a Content-Encoding itself; a broken gzip stream raised out of the handler."""
    body = b"not gzip at all"
    async with running_ingress(settings, sources) as client:
        answer = await raw_post(client, "/webhooks/edge", body, [*signature_for(body), (b"Content-Encoding", b"gzip")])
    assert answer == (400, {"error": "invalid_json"})


async def test_an_events_queue_created_with_another_delivery_limit_is_published_to(settings, sources, monkeypatch):
    """WEBHOOK_INGEST_DELIVERY_LIMIT changed after the queue was created: the
    ingress's declaration failed (PRECONDITION_FAILED) at every connect, and
    every event went to the outbox for good."""
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        await topology.declare_events_queue(await connection.channel(), settings.namespace, settings.delivery_limit)
    monkeypatch.setenv("WEBHOOK_INGEST_DELIVERY_LIMIT", str(settings.delivery_limit + 1))
    async with running_ingress(type(settings)(), sources) as client:
        assert (await post(client, json.dumps({"id": "limit"}).encode()))[0] == 200
    assert await stored_copies(settings) == {"edge:limit": 1}
    assert await _outbox_keys(settings.database_url) == {}


async def test_outbox_rows_the_relay_cannot_read_do_not_hold_back_the_rows_behind_them(settings, sources):
    """120 rows no relay can decode (written by a release that is gone, or
    damaged) at the head of the outbox: they stay for an operator, logged
    and counted, while the event behind them is published."""
    unreadable = [(f"edge:bad_{n}", "edge", f"bad_{n}", "0" * 64, b"{}", b"not a field table") for n in range(120)]
    readable = outbox_row(make_event("edge", "behind"))
    connection = await asyncpg.connect(settings.database_url)
    try:
        await connection.execute(OUTBOX_SQL["store_in_outbox"], *outbox_columns(unreadable))
        await connection.execute(OUTBOX_SQL["store_in_outbox"], *outbox_columns([readable]))
    finally:
        await connection.close()
    async with running_ingress(settings, sources) as client:

        async def published() -> bool:
            return (await _outbox_keys(settings.database_url))["edge:behind"] == 0

        await wait_until(published, timeout=5, message="the event behind the unreadable rows published")
        metrics_text = await (await client.get("/metrics")).text()
    assert await _queued_keys(settings) == {"edge:behind": 1}
    assert sum((await _outbox_keys(settings.database_url)).values()) == 120
    assert "webhook_outbox_unreadable 120.0" in metrics_text.splitlines()
