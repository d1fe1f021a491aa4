"""ingress/intake: the ingress HTTP contract (docs/reference.md §6) against the
real RabbitMQ, and the app at its edges (source keys, headers, numbers)."""

import asyncio
import json
import time
from collections import Counter

import aio_pika
import asyncpg
import pytest

from tests.support.broker import amqp_port
from tests.support.events import make_event, publish_events
from tests.support.ingress import queued_events, running_ingress
from tests.support.processes import wait_until
from tests.support.signing import PROVIDER_SECRETS
from tests.support.tcpproxy import TcpProxy
from webhook_ingest.ingress.publishing.outbox import QUERIES as OUTBOX_SQL
from webhook_ingest.ingress.publishing.outbox import outbox_columns, outbox_row
from webhook_ingest.shared import signatures
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.errors import ConfigError
from webhook_ingest.shared.event.message import from_amqp
from webhook_ingest.shared.sources.model import load_sources

SECRETS = PROVIDER_SECRETS
ID_HEADERS = {"github": "X-GitHub-Delivery", "shopify": "X-Shopify-Webhook-Id", "hmac-sha256": "X-Event-ID"}


@pytest.fixture
def sources(tmp_path):
    sections = [
        f'[sources.{scheme.replace("-", "_")}]\nscheme = "{scheme}"\n'
        f'secrets = ["old-{scheme}", "{secret}"]\nhandler = "inbox"\n'
        for scheme, secret in SECRETS.items()
    ]
    sections.append(
        '[sources.strict]\nscheme = "hmac-sha256"\nsecrets = ["s"]\nhandler = "inbox"\n'
        "fallback_hash = false\nmax_body_bytes = 64\n"
    )
    path = tmp_path / "sources.toml"
    path.write_text("\n".join(sections))
    return load_sources(str(path))


def signed(scheme: str, body: bytes, event_id: str = "evt_1", secret: str | None = None, **kwargs) -> dict:
    headers = signatures.sign(scheme, body, secret or SECRETS[scheme], **kwargs)
    if scheme in ID_HEADERS:
        headers[ID_HEADERS[scheme]] = event_id
    return headers


def body_for(scheme: str, event_id: str = "evt_1") -> bytes:
    if scheme == "paystack":
        return json.dumps({"event": "charge.success", "data": {"id": 42, "reference": event_id}}).encode()
    return json.dumps({"id": event_id, "type": "invoice.paid", "amount": 12345678901234567890123}).encode()


@pytest.mark.parametrize("scheme", list(SECRETS))
async def test_each_scheme_accepts_a_signed_event_and_queues_it_verbatim(settings, sources, scheme):
    source = scheme.replace("-", "_")
    body = body_for(scheme)
    async with running_ingress(settings, sources) as client:
        response = await client.post(f"/webhooks/{source}", data=body, headers=signed(scheme, body))
        answer = await response.json()
    assert response.status == 200, answer
    assert answer["status"] == "accepted"
    [event] = await queued_events(settings.amqp_url, settings.namespace)
    assert event.body == body  # never re-serialised
    assert event.key == answer["key"] and event.key.startswith(f"{source}:")
    assert event.attempt == 1 and event.source == source


@pytest.mark.parametrize("scheme", list(SECRETS))
async def test_each_scheme_rejects_tampering_wrong_secret_and_missing_header(settings, sources, scheme):
    source = scheme.replace("-", "_")
    body = body_for(scheme)
    headers = signed(scheme, body)
    cases = {
        "tampered": (body[:-2] + b"9}", headers, "invalid_signature"),
        "wrong secret": (body, signed(scheme, body, secret="whsec_" + "A" * 32), "invalid_signature"),
        "no header": (
            body,
            {k: v for k, v in headers.items() if "ignature" not in k and "Hmac" not in k},
            "missing_signature",
        ),
    }
    async with running_ingress(settings, sources) as client:
        for case, (sent_body, sent_headers, code) in cases.items():
            response = await client.post(f"/webhooks/{source}", data=sent_body, headers=sent_headers)
            assert (response.status, await response.json()) == (401, {"error": code}), case
    assert await queued_events(settings.amqp_url, settings.namespace) == []


@pytest.mark.parametrize("scheme", ["stripe", "standard-webhooks"])
async def test_stale_and_future_timestamps_are_refused(settings, sources, scheme):
    source = scheme.replace("-", "_")
    body = body_for(scheme)
    async with running_ingress(settings, sources) as client:
        for skew in (-301, +301):
            headers = signed(scheme, body, timestamp=int(time.time()) + skew)
            response = await client.post(f"/webhooks/{source}", data=body, headers=headers)
            assert (response.status, await response.json()) == (401, {"error": "stale_timestamp"})
        wrong_and_stale = signed(scheme, body, secret="whsec_" + "B" * 32, timestamp=int(time.time()) - 999)
        response = await client.post(f"/webhooks/{source}", data=body, headers=wrong_and_stale)
        assert (await response.json()) == {"error": "invalid_signature"}
    assert await queued_events(settings.amqp_url, settings.namespace) == []


async def test_bad_input_rows_answer_in_spec_order_and_queue_nothing(settings, sources):
    async with running_ingress(settings, sources) as client:

        async def post(source: str, body: bytes, headers: dict | None = None):
            response = await client.post(f"/webhooks/{source}", data=body, headers=headers or {})
            return response.status, await response.json()

        assert await post("nope", b"{}") == (404, {"error": "unknown_source"})
        assert await post("strict", b"x" * 65) == (413, {"error": "body_too_large"})
        exactly_64 = json.dumps({"id": "e", "pad": "p" * 42}).encode()
        assert len(exactly_64) == 64
        ok = signatures.sign("hmac-sha256", exactly_64, "s")
        assert (await post("strict", exactly_64, {**ok, "X-Event-ID": "a"}))[0] == 200
        assert await post("strict", b"{}", {}) == (401, {"error": "missing_signature"})
        assert await post("strict", b"{}", {"X-Signature": "sha256=zz"}) == (401, {"error": "invalid_signature"})
        for not_json in (b"{nope", b"[1, 2]", b'"text"'):
            assert await post("strict", not_json, signatures.sign("hmac-sha256", not_json, "s")) == (
                400,
                {"error": "invalid_json"},
            )
        no_id = b'{"type": "x"}'
        assert await post("strict", no_id, signatures.sign("hmac-sha256", no_id, "s")) == (
            400,
            {"error": "missing_event_id"},
        )
    [accepted] = await queued_events(settings.amqp_url, settings.namespace)
    assert accepted.key == "strict:e"  # the signed body's id, not the unsigned X-Event-ID (issue 36)


async def test_without_an_event_id_the_key_is_the_payload_hash(settings, sources):
    body = b'{"type": "no.id", "n": 1}'
    async with running_ingress(settings, sources) as client:
        response = await client.post(
            "/webhooks/hmac_sha256", data=body, headers=signatures.sign("hmac-sha256", body, "hmac-secret")
        )
        answer = await response.json()
    assert response.status == 200
    assert answer["key"].startswith("hmac_sha256:sha256:") and len(answer["key"]) == len("hmac_sha256:sha256:") + 64


async def test_broker_unreachable_the_event_waits_in_the_outbox(settings, sources, monkeypatch):
    monkeypatch.setenv("AMQP_URL", "amqp://guest:guest@127.0.0.1:1/")
    unreachable = type(settings)()
    body = body_for("hmac-sha256")
    async with running_ingress(unreachable, sources, wait_ready=False) as client:
        response = await client.post("/webhooks/hmac_sha256", data=body, headers=signed("hmac-sha256", body))
        assert (response.status, await response.json()) == (200, {"status": "accepted", "key": "hmac_sha256:evt_1"})
        assert (await client.get("/readyz")).status == 200  # it can accept: through the outbox
    [(key, stored_body)] = await outbox_rows(settings.database_url)
    assert (key, stored_body) == ("hmac_sha256:evt_1", body)


async def test_postgres_unreachable_from_the_start_the_ingress_serves_through_the_broker(
    settings, sources, monkeypatch
):
    monkeypatch.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1:1/nowhere")
    body = body_for("hmac-sha256")
    async with running_ingress(type(settings)(), sources) as client:
        response = await client.post("/webhooks/hmac_sha256", data=body, headers=signed("hmac-sha256", body))
        assert (response.status, await response.json()) == (200, {"status": "accepted", "key": "hmac_sha256:evt_1"})
    assert [event.key for event in await queued_events(settings.amqp_url, settings.namespace)] == ["hmac_sha256:evt_1"]


async def test_broker_and_postgres_unreachable_gives_503_and_stores_nothing(settings, sources, monkeypatch):
    monkeypatch.setenv("AMQP_URL", "amqp://guest:guest@127.0.0.1:1/")
    monkeypatch.setenv("DATABASE_URL", "postgresql://postgres@127.0.0.1:1/nowhere")
    unreachable = type(settings)()
    body = body_for("hmac-sha256")
    async with running_ingress(unreachable, sources, wait_ready=False) as client:
        response = await client.post("/webhooks/hmac_sha256", data=body, headers=signed("hmac-sha256", body))
        assert response.status == 503
        assert await response.json() == {"error": "unavailable"}
        assert int(response.headers["Retry-After"]) > 0
        assert (await client.get("/readyz")).status == 503
        assert (await client.get("/healthz")).status == 200
    assert await outbox_rows(settings.database_url) == []
    await publish_events(settings.amqp_url, settings.namespace, [])  # declares the queue, publishes nothing
    assert await queued_events(settings.amqp_url, settings.namespace) == []


async def test_broker_outage_then_recovery_by_itself(settings, sources, monkeypatch):
    """Accepted into the outbox while the broker is cut, relayed once it is back."""
    first, second = body_for("hmac-sha256", "evt_1"), body_for("hmac-sha256", "evt_2")
    with TcpProxy("127.0.0.1", amqp_port()) as proxy:
        monkeypatch.setenv("AMQP_URL", proxy.url_for(settings.amqp_url))
        proxied = type(settings)()
        async with running_ingress(proxied, sources) as client:
            proxy.cut()
            response = await client.post(
                "/webhooks/hmac_sha256", data=first, headers=signed("hmac-sha256", first, "evt_1")
            )
            assert response.status == 200
            assert len(await outbox_rows(settings.database_url)) == 1
            proxy.restore()
            await wait_until(lambda: _outbox_empty(settings.database_url), 30, message="the outbox relayed")
            response = await client.post(
                "/webhooks/hmac_sha256", data=second, headers=signed("hmac-sha256", second, "evt_2")
            )
            assert response.status == 200
    queued = await queued_events(settings.amqp_url, settings.namespace)
    assert sorted((e.key, e.body) for e in queued) == [("hmac_sha256:evt_1", first), ("hmac_sha256:evt_2", second)]


async def test_a_broker_that_stops_confirming_sends_events_to_the_outbox_until_it_confirms_again(
    settings, sources, monkeypatch
):
    """The connection stays open but nothing comes back (as under a memory
    alarm): the first request waits 1 s for its confirm, then every request
    goes to the outbox at once; once the broker answers, the relay empties it."""
    bodies = [body_for("hmac-sha256", f"evt_{n}") for n in range(21)]

    async def post(n: int) -> int:
        headers = signed("hmac-sha256", bodies[n], f"evt_{n}")
        return (await client.post("/webhooks/hmac_sha256", data=bodies[n], headers=headers)).status

    with TcpProxy("127.0.0.1", amqp_port()) as proxy:
        monkeypatch.setenv("AMQP_URL", proxy.url_for(settings.amqp_url))
        async with running_ingress(type(settings)(), sources) as client:
            proxy.stall()
            assert await post(0) == 200  # after waiting 1 s for a confirm
            assert await asyncio.gather(*(post(n) for n in range(1, 21))) == [200] * 20
            assert len(await outbox_rows(settings.database_url)) == 21
            assert (await (await client.get("/readyz")).json())["via"] == "outbox"
            proxy.flow()
            await wait_until(lambda: _outbox_empty(settings.database_url), 60, message="the outbox relayed")
    queued = {event.key for event in await queued_events(settings.amqp_url, settings.namespace)}
    assert queued == {f"hmac_sha256:evt_{n}" for n in range(21)}


async def outbox_rows(database_url: str) -> list[tuple[str, bytes]]:
    connection = await asyncpg.connect(database_url)
    try:
        return [(row["key"], row["body"]) for row in await connection.fetch("SELECT key, body FROM outbox ORDER BY id")]
    finally:
        await connection.close()


async def _outbox_empty(database_url: str) -> bool:
    return not await outbox_rows(database_url)


async def test_metrics_count_requests_by_source_and_status(settings, sources):
    async with running_ingress(settings, sources) as client:
        await client.post("/webhooks/nope", data=b"{}")
        text = await (await client.get("/metrics")).text()
    assert 'webhook_ingress_requests_total{source="unknown",status="404"}' in text
    assert "webhook_ingress_request_duration_seconds_bucket" in text


# -- found by the adversary review, round 4 (the app at its edges; the findings
# that need worker processes are in tests/acceptance/test_retries_and_dead_letters.py
# and test_degraded.py) -----------------------------------------------------------

SECRET = "round4-secret"


def _sources_file(tmp_path, *names: str) -> str:
    path = tmp_path / "sources.toml"
    path.write_text(
        "".join(
            f'[sources."{name}"]\nscheme = "hmac-sha256"\nsecrets = ["{SECRET}"]\nhandler = "inbox"\n' for name in names
        )
    )
    return str(path)


async def _post(client, source: str, body: bytes, **headers: str) -> tuple[int, dict]:
    response = await client.post(
        f"/webhooks/{source}", data=body, headers={**signatures.sign("hmac-sha256", body, SECRET), **headers}
    )
    return response.status, await response.json()


async def test_two_sources_never_share_an_idempotency_key(settings, tmp_path):
    """Finding C2. §5: the key is SOURCE:EVENT_ID, and keys never collide
    across sources. A source name may hold a colon (`[sources."acme:eu"]`,
    the URL /webhooks/acme:eu), so source `acme` with event id `eu:1` and
    source `acme:eu` with event id `1` are both the key `acme:eu:1`: the
    second event is taken for a copy (or a conflict) of the first and never
    runs. Either such a sources file is refused at start with a line naming
    the source, or the two events get two keys."""
    try:
        sources = load_sources(_sources_file(tmp_path, "acme", "acme:eu"))
    except ConfigError as refused:
        assert "acme:eu" in str(refused)
        return
    body = json.dumps({"type": "invoice.paid"}).encode()
    async with running_ingress(settings, sources) as client:
        first = await _post(client, "acme", body, **{"X-Event-ID": "eu:1"})
        second = await _post(client, "acme:eu", body, **{"X-Event-ID": "1"})
    assert first[0] == second[0] == 200
    assert len({event.key for event in await queued_events(settings.amqp_url, settings.namespace)}) == 2


async def test_a_long_header_name_reaches_the_handler_intact_or_is_refused(settings, tmp_path):
    """Finding C3. The provider's headers ride as an AMQP field table, whose
    field names pamqp cuts to 128 bytes with nothing but a log line: a
    header named longer than that reaches `event.headers` renamed, and two
    such headers that share their first 128 bytes become one — one value
    gone, answered 200. Bad input gets a clear error, or nothing is lost."""
    sources = load_sources(_sources_file(tmp_path, "acme"))
    prefix = "X-Trace-" + "t" * 130
    body = json.dumps({"id": "long-header-names"}).encode()
    async with running_ingress(settings, sources) as client:
        status, answer = await _post(client, "acme", body, **{prefix + "-a": "first", prefix + "-b": "second"})
    if status == 431:
        assert answer == {"error": "headers_too_large"}
        return
    assert status == 200
    [event] = await queued_events(settings.amqp_url, settings.namespace)
    assert {event.headers.get(prefix.lower() + "-a"), event.headers.get(prefix.lower() + "-b")} == {"first", "second"}


async def test_a_number_too_small_for_a_float_is_refused_or_told_apart(settings, tmp_path):
    """Finding C7. storable_json refuses 1e400 because "a handler would read
    inf, and 1e400 and 1e401 would hash alike". A nonzero number below the
    smallest float is the same case the other way: Python reads 1e-400 and
    2e-400 as 0.0, so the handler gets 0.0 for an amount that is not zero,
    and the two payloads hash alike — the corrected event (a conflict, §5)
    is taken for a copy of the first. Postgres's numeric keeps both exactly."""
    sources = load_sources(_sources_file(tmp_path, "acme"))
    bodies = [b'{"id":"tiny","amount":1e-400}', b'{"id":"tiny","amount":2e-400}']
    async with running_ingress(settings, sources) as client:
        answers = [await _post(client, "acme", body) for body in bodies]
    if all(answer == (400, {"error": "invalid_json"}) for answer in answers):
        return
    assert [status for status, _ in answers] == [200, 200]
    hashes = {event.payload_sha256 for event in await queued_events(settings.amqp_url, settings.namespace)}
    assert len(hashes) == 2


async def test_a_header_sent_twice_reaches_the_handler_with_both_values(settings, tmp_path):
    """Finding C8. HTTP allows a header name on several lines (a proxy
    adding its own `Via`, a provider's repeated `X-Tag`), and RFC 9110, section 5.3
    says they mean one line of the values joined by commas. The ingress
    kept the last line only: the earlier values never reached
    `event.headers`, answered 200 — "loses nothing" says otherwise."""
    from multidict import CIMultiDict

    sources = load_sources(_sources_file(tmp_path, "acme"))
    body = json.dumps({"id": "repeated-header"}).encode()
    headers = CIMultiDict(signatures.sign("hmac-sha256", body, SECRET))
    headers.add("X-Tag", "first")
    headers.add("X-Tag", "second")
    async with running_ingress(settings, sources) as client:
        response = await client.post("/webhooks/acme", data=body, headers=headers)
    assert response.status == 200
    [event] = await queued_events(settings.amqp_url, settings.namespace)
    assert event.headers["x-tag"] == "first, second"


# The ingress at its edges: odd but valid input, and a broker that does not
# take the message. A 200 is never sent for an event that is not stored.

EDGE_SECRET = "edge-secret"


@pytest.fixture
def edge_sources(tmp_path):
    path = tmp_path / "sources.toml"
    path.write_text(f'[sources.edge]\nscheme = "hmac-sha256"\nsecrets = ["{EDGE_SECRET}"]\nhandler = "inbox"\n')
    return load_sources(str(path))


def edge_signed(body: bytes, event_id: str | None = None) -> dict:
    headers = signatures.sign("hmac-sha256", body, EDGE_SECRET)
    return {**headers, "X-Event-ID": event_id} if event_id else headers


async def post(client, body: bytes, event_id: str | None = None) -> tuple[int, dict]:
    response = await client.post("/webhooks/edge", data=body, headers=edge_signed(body, event_id))
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


async def test_an_unroutable_publish_is_never_answered_200(settings, edge_sources):
    """The events queue deleted under a running ingress: the broker returns
    every publish. Copies of one key published at once must each learn it."""
    async with running_ingress(settings, edge_sources) as client:
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


async def test_json_that_postgres_cannot_store_is_refused_at_the_door(settings, edge_sources):
    async with running_ingress(settings, edge_sources) as client:
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


async def test_a_header_byte_that_is_not_utf8_is_escaped_never_a_5xx(settings, edge_sources):
    """obs-text (bytes 0x80-0xff that are not UTF-8) is allowed in a header
    value; it reaches the handler escaped as the text \\xNN."""
    body = json.dumps({"id": "latin1"}).encode()
    signature = [(name.encode(), value.encode()) for name, value in edge_signed(body).items()]
    async with running_ingress(settings, edge_sources) as client:
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
    return [(name.encode(), value.encode()) for name, value in edge_signed(body).items()]


async def test_what_would_not_fit_an_amqp_frame_is_refused_and_the_ingress_keeps_publishing(settings, edge_sources):
    """Headers of 320 KB made the broker close the ingress's connection (a
    frame over frame_max); from the outbox the event did it again at every
    relay attempt. Too much header, or too long an event id, is a 4xx now."""
    body = json.dumps({"id": "big"}).encode()
    padding = [(f"X-Pad-{n}".encode(), b"v" * 8000) for n in range(40)]
    long_id_in_body = json.dumps({"id": "i" * 200_000}).encode()
    async with running_ingress(settings, edge_sources) as client:
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


async def test_a_body_that_cannot_be_decoded_is_a_400_not_a_500(settings, edge_sources):
    """aiohttp decodes a Content-Encoding itself; a broken gzip stream raised out of the handler."""
    body = b"not gzip at all"
    async with running_ingress(settings, edge_sources) as client:
        answer = await raw_post(client, "/webhooks/edge", body, [*signature_for(body), (b"Content-Encoding", b"gzip")])
    assert answer == (400, {"error": "invalid_json"})


async def test_an_events_queue_created_with_another_delivery_limit_is_published_to(settings, edge_sources, monkeypatch):
    """WEBHOOK_INGEST_DELIVERY_LIMIT changed after the queue was created: the
    ingress's declaration failed (PRECONDITION_FAILED) at every connect, and
    every event went to the outbox for good."""
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        await topology.declare_events_queue(await connection.channel(), settings.namespace, settings.delivery_limit)
    monkeypatch.setenv("WEBHOOK_INGEST_DELIVERY_LIMIT", str(settings.delivery_limit + 1))
    async with running_ingress(type(settings)(), edge_sources) as client:
        assert (await post(client, json.dumps({"id": "limit"}).encode()))[0] == 200
    assert await stored_copies(settings) == {"edge:limit": 1}
    assert await _outbox_keys(settings.database_url) == {}


async def test_outbox_rows_the_relay_cannot_read_do_not_hold_back_the_rows_behind_them(settings, edge_sources):
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
    async with running_ingress(settings, edge_sources) as client:

        async def published() -> bool:
            return (await _outbox_keys(settings.database_url))["edge:behind"] == 0

        await wait_until(published, timeout=5, message="the event behind the unreadable rows published")
        metrics_text = await (await client.get("/metrics")).text()
    assert await _queued_keys(settings) == {"edge:behind": 1}
    assert sum((await _outbox_keys(settings.database_url)).values()) == 120
    assert "webhook_outbox_unreadable 120.0" in metrics_text.splitlines()
