"""The ingress as a public endpoint: allowlists, trusted proxies, the rate
limit without Redis, the concurrency bound and the sign-in throttle, on the
real app against the real services."""

import asyncio
import re
from collections import Counter

import aiohttp
import orjson
import pytest
import redis.asyncio as redis

from tests.support.ingress import queued_events, running_ingress, status_lines_once_answered
from tests.support.tcpproxy import free_port
from webhook_ingest.ingress.intake.failure_budget import FAILURES_BURST
from webhook_ingest.ingress.intake.limits import sign_in_throttle_key
from webhook_ingest.shared import signatures
from webhook_ingest.shared.observability.metrics import ingress_rate_limit_local
from webhook_ingest.shared.ratelimit import RateLimiter
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources

SECRET = "public-endpoint-secret"


@pytest.fixture
def sources(tmp_path):
    path = tmp_path / "sources.toml"
    path.write_text(
        f'[sources.outside]\nscheme = "hmac-sha256"\nsecrets = ["{SECRET}"]\nhandler = "inbox"\n'
        'allowed_ips = ["203.0.113.0/24", "2001:db8::/32"]\n'
        f'[sources.inside]\nscheme = "hmac-sha256"\nsecrets = ["{SECRET}"]\nhandler = "inbox"\n'
        'allowed_ips = ["127.0.0.0/8", "::1/128"]\n'
        f'[sources.limited]\nscheme = "hmac-sha256"\nsecrets = ["{SECRET}"]\nhandler = "inbox"\n'
        "rate_limit = { per_second = 0.01, burst = 3 }\n"
        f'[sources.office]\nscheme = "hmac-sha256"\nsecrets = ["{SECRET}"]\nhandler = "inbox"\n'
        'allowed_ips = ["10.1.2.0/24"]\n'
    )
    return load_sources(str(path))


def signed(n: int = 1, **extra_headers: str) -> tuple[bytes, dict[str, str]]:
    body = orjson.dumps({"id": f"evt_{n}"})
    return body, {**signatures.sign("hmac-sha256", body, SECRET), **extra_headers}


def settings_with(monkeypatch, **env: str) -> Settings:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings()


async def test_the_allowlist_answers_403_before_the_signature_and_queues_nothing(settings, sources):
    body, headers = signed()
    async with running_ingress(settings, sources) as client:
        refused = await client.post("/webhooks/outside", data=b"not even signed")
        assert (refused.status, await refused.json()) == (403, {"error": "forbidden_source_ip"})
        accepted = await client.post("/webhooks/inside", data=body, headers=headers)
        assert accepted.status == 200, await accepted.text()
    [event] = await queued_events(settings.amqp_url, settings.namespace)
    assert event.source == "inside"


@pytest.mark.parametrize("header", ["X-Forwarded-For", "Forwarded"])
async def test_a_trusted_proxy_sets_the_client_address(settings, sources, monkeypatch, header):
    proxied = settings_with(
        monkeypatch, WEBHOOK_INGEST_TRUSTED_PROXIES="127.0.0.1/32, ::1", WEBHOOK_INGEST_CLIENT_ADDRESS_HEADER=header
    )

    def forwarded(address: str) -> dict[str, str]:
        hops = f"{address}, 127.0.0.1" if header == "X-Forwarded-For" else f'for="{address}", for="127.0.0.1"'
        return {header: hops}

    async with running_ingress(proxied, sources) as client:
        body, headers = signed(1, **forwarded("203.0.113.7"))
        assert (await client.post("/webhooks/outside", data=body, headers=headers)).status == 200
        body, headers = signed(2, **forwarded("[2001:db8::5]:443" if header == "Forwarded" else "2001:db8::5"))
        assert (await client.post("/webhooks/outside", data=body, headers=headers)).status == 200
        body, headers = signed(3, **forwarded("198.51.100.1"))
        assert (await client.post("/webhooks/outside", data=body, headers=headers)).status == 403
        body, headers = signed(4, **forwarded("198.51.100.1"))  # the proxy's client is not loopback
        assert (await client.post("/webhooks/inside", data=body, headers=headers)).status == 403
    assert len(await queued_events(settings.amqp_url, settings.namespace)) == 2


async def test_behind_an_x_forwarded_for_proxy_a_clients_own_forwarded_is_ignored(settings, sources, monkeypatch):
    """nginx, ingress-nginx, ALB: they append to X-Forwarded-For and pass Forwarded through (issue 21, item 1)."""
    proxied = settings_with(monkeypatch, WEBHOOK_INGEST_TRUSTED_PROXIES="127.0.0.1/32")
    async with running_ingress(proxied, sources) as client:
        body, headers = signed(1, **{"Forwarded": "for=10.1.2.3", "X-Forwarded-For": "203.0.113.9"})
        spoofed = await client.post("/webhooks/office", data=body, headers=headers)
        assert (spoofed.status, await spoofed.json()) == (403, {"error": "forbidden_source_ip"})
        body, headers = signed(2, **{"Forwarded": "for=203.0.113.9", "X-Forwarded-For": "10.1.2.3"})
        assert (await client.post("/webhooks/office", data=body, headers=headers)).status == 200
    assert [event.key for event in await queued_events(settings.amqp_url, settings.namespace)] == ["office:evt_2"]


async def test_behind_a_forwarded_proxy_a_clients_own_x_forwarded_for_is_ignored(settings, sources, monkeypatch):
    proxied = settings_with(
        monkeypatch, WEBHOOK_INGEST_TRUSTED_PROXIES="127.0.0.1/32", WEBHOOK_INGEST_CLIENT_ADDRESS_HEADER="forwarded"
    )
    spoofs = [
        {"X-Forwarded-For": "10.1.2.3", "Forwarded": "for=203.0.113.9"},
        {"Forwarded": 'for=10.1.2.3;x=", for="[2001:db8::9]"'},  # a client's quote, the proxy's element
        {"Forwarded": "for=10.1.2.3, for=203.0.113.9"},
    ]
    async with running_ingress(proxied, sources) as client:
        for n, spoof in enumerate(spoofs):
            body, headers = signed(n, **spoof)
            assert (await client.post("/webhooks/office", data=body, headers=headers)).status == 403, spoof
        body, headers = signed(9, **{"Forwarded": "for=10.1.2.3;proto=https", "X-Forwarded-For": "203.0.113.9"})
        assert (await client.post("/webhooks/office", data=body, headers=headers)).status == 200


async def test_a_forged_forwarded_does_not_dodge_the_console_sign_in_throttle(settings, sources, monkeypatch):
    proxied = settings_with(
        monkeypatch,
        WEBHOOK_INGEST_TRUSTED_PROXIES="127.0.0.1/32",
        WEBHOOK_INGEST_ADMIN_TOKEN="operator-token-for-the-throttle-test",
    )
    async with running_ingress(proxied, sources) as client:
        login = await (await client.get("/console/login")).text()
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', login)[1]
        statuses = []
        for n in range(30):
            headers = {"X-Forwarded-For": "203.0.113.9", "Forwarded": f"for=10.1.2.{n}"}
            answer = await client.post("/console/login", data={"csrf_token": csrf, "token": "guess"}, headers=headers)
            statuses.append(answer.status)
    assert statuses == [401] * 5 + [429] * 25


async def test_forwarding_headers_from_an_untrusted_peer_are_ignored(settings, sources, monkeypatch):
    elsewhere = settings_with(monkeypatch, WEBHOOK_INGEST_TRUSTED_PROXIES="10.0.0.0/8")
    async with running_ingress(elsewhere, sources) as client:
        for header, value in [("X-Forwarded-For", "203.0.113.7"), ("Forwarded", "for=203.0.113.7")]:
            body, headers = signed(1, **{header: value})
            assert (await client.post("/webhooks/outside", data=body, headers=headers)).status == 403
        assert (await client.post("/webhooks/inside", data=body, headers=headers)).status == 200


async def test_with_redis_away_the_rate_limit_holds_per_process_and_never_fails_closed(settings, sources, monkeypatch):
    no_redis = settings_with(monkeypatch, REDIS_URLS=f"redis://127.0.0.1:{free_port()}/0")
    async with running_ingress(no_redis, sources) as client:
        statuses = []
        for n in range(5):
            body, headers = signed(n)
            response = await client.post("/webhooks/limited", data=body, headers=headers)
            statuses.append((response.status, response.headers.get("Retry-After")))
        body, headers = signed(9)
        unlimited = await client.post("/webhooks/inside", data=body, headers=headers)
        metrics = await (await client.get("/metrics")).text()
    assert statuses[:3] == [(200, None)] * 3
    assert [status for status, _ in statuses[3:]] == [429, 429] and all(int(wait) >= 1 for _, wait in statuses[3:])
    assert unlimited.status == 200
    assert "webhook_ingress_rate_limit_local 1.0" in metrics
    assert 'webhook_ingress_requests_total{source="limited",status="429"} 2.0' in metrics


async def test_unverified_requests_do_not_spend_the_sources_rate_limit(settings, sources):
    """5+ unsigned or wrongly signed POSTs, then the provider's delivery: 200, not 429 (issue 21, item 2)."""
    async with running_ingress(settings, sources) as client:
        wrong = signatures.sign("hmac-sha256", b"{}", "not-the-secret")
        refused = [await client.post("/webhooks/limited", data=b"{}", headers=wrong if n % 2 else {}) for n in range(6)]
        assert [answer.status for answer in refused] == [401] * 6
        body, headers = signed(1)
        assert (await client.post("/webhooks/limited", data=body, headers=headers)).status == 200


async def test_a_client_failing_verification_is_answered_429_past_its_budget(settings, sources):
    """Failures spend a budget of their client's: beyond it 429 with
    `Retry-After`, for that client only (its signed deliveries are still
    served: test_failures_from_a_shared_address_never_refuse_its_valid_deliveries)."""
    async with running_ingress(settings, sources) as client:
        statuses = [(await client.post("/webhooks/inside", data=b"{}")).status for _ in range(FAILURES_BURST + 3)]
        assert statuses == [401] * FAILURES_BURST + [429] * 3
        past = await client.post("/webhooks/inside", data=b"{}")
        assert (past.status, await past.json()) == (429, {"error": "too_many_failures"})
        assert int(past.headers["Retry-After"]) >= 1
        other = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
        async with aiohttp.ClientSession(connector=other) as session:
            url = f"http://127.0.0.1:{client.port}/webhooks/inside"
            async with session.post(url, data=b"{}") as answer:
                assert answer.status == 401, await answer.text()


async def test_failures_from_a_shared_address_never_refuse_its_valid_deliveries(settings, sources):
    """Issue 36, finding 7: providers deliver every customer's webhooks from a
    few addresses, and anyone may point their own account at our URL with a
    wrong secret. Their failures still get 401, then 429 once over the
    budget; the provider's signed deliveries from that address are accepted."""
    wrong_body = orjson.dumps({"id": "someone_elses"})
    wrong = signatures.sign("hmac-sha256", wrong_body, "someone-elses-secret")
    async with running_ingress(settings, sources) as client:
        failed, delivered = [], []
        for n in range(4):
            for _ in range(10):
                failed.append((await client.post("/webhooks/inside", data=wrong_body, headers=wrong)).status)
            body, headers = signed(n)
            delivered.append((await client.post("/webhooks/inside", data=body, headers=headers)).status)
    assert failed == [401] * FAILURES_BURST + [429] * (40 - FAILURES_BURST)
    assert delivered == [200] * 4
    assert sorted(event.key for event in await queued_events(settings.amqp_url, settings.namespace)) == [
        f"inside:evt_{n}" for n in range(4)
    ]


async def test_beyond_the_concurrency_bound_the_ingress_answers_503_at_once(settings, sources, monkeypatch):
    bounded = settings_with(monkeypatch, WEBHOOK_INGEST_MAX_CONCURRENT_REQUESTS="1")
    body, headers = signed()
    async with running_ingress(bounded, sources) as client:
        reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
        head = f"POST /webhooks/inside HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
        writer.write(head.encode() + b"\r\n" + body[:3])  # in flight: its body is not all there
        await writer.drain()
        await asyncio.sleep(0.2)
        busy = await client.post("/webhooks/inside", data=body, headers=headers)
        assert (busy.status, await busy.json()) == (503, {"error": "unavailable"})
        assert busy.headers["Retry-After"] == "1"
        writer.write(body[3:])
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        writer.close()
        assert (await client.post("/webhooks/inside", data=body, headers=headers)).status == 200


async def trickling(port: int, client_address: str, body: bytes, headers: dict[str, str]):
    """A connection from `client_address` that sent its headers and sends
    its body one byte every 0.2 s: (reader, writer, the trickling task)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(client_address, 0))
    head = f"POST /webhooks/inside HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.items())
    writer.write(head.encode() + b"\r\n")

    async def trickle() -> None:
        for byte in body:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.2)

    return reader, writer, asyncio.create_task(trickle())


async def test_one_client_trickling_many_bodies_does_not_starve_another(settings, sources, monkeypatch):
    """Issue 21, item 3: real connections from 127.0.0.3 holding slow bodies,
    a signed delivery from 127.0.0.1 meanwhile. Once slow (PROMPT_BODY_SECONDS),
    all but 3 are answered 429 and closed."""
    bounded = settings_with(
        monkeypatch, WEBHOOK_INGEST_MAX_CONCURRENT_REQUESTS="12", WEBHOOK_INGEST_MAX_BODIES_PER_CLIENT="3"
    )
    slow_body = orjson.dumps({"id": "evt_1", "padding": "x" * 200})  # 40 s at a byte every 0.2 s
    body, headers = slow_body, signatures.sign("hmac-sha256", slow_body, SECRET)
    async with running_ingress(bounded, sources) as client:
        slow = [await trickling(client.port, "127.0.0.3", body, headers) for _ in range(12)]
        try:
            heads = await status_lines_once_answered([reader for reader, _, _ in slow], answered=9)
            delivery, delivery_headers = signed(2)
            other = await client.post("/webhooks/inside", data=delivery, headers=delivery_headers)
            assert other.status == 200, await other.text()
        finally:
            for _, writer, task in slow:
                task.cancel()
                writer.close()
    assert Counter(heads) == {b"HTTP/1.1 429 Too Many Requests": 9, None: 3}  # 3 still trickling


async def test_a_burst_from_one_address_whose_bodies_follow_their_headers_is_all_accepted(settings, sources):
    """Issue 36, finding 6: a provider sends many deliveries at once from one
    address, each body in the segment after its headers. Those bodies are not
    trickling: every one is accepted (GitHub would not redeliver a 429)."""
    burst = 64  # twice the default WEBHOOK_INGEST_MAX_BODIES_PER_CLIENT
    async with running_ingress(settings, sources) as client:
        connections = [
            await asyncio.open_connection("127.0.0.1", client.port, local_addr=("127.0.0.4", 0)) for _ in range(burst)
        ]
        bodies = [signed(n) for n in range(burst)]
        for (_, writer), (body, headers) in zip(connections, bodies):
            head = f"POST /webhooks/inside HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
            writer.write((head + "".join(f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n").encode())
            await writer.drain()
        await asyncio.sleep(0.1)  # every request's headers read, its body not yet sent
        for (_, writer), (body, _) in zip(connections, bodies):
            writer.write(body)
        heads = [(await reader.readuntil(b"\r\n\r\n")).split(b"\r\n")[0] for reader, _ in connections]
        for _, writer in connections:
            writer.close()
    assert Counter(heads) == {b"HTTP/1.1 200 OK": burst}
    assert len(await queued_events(settings.amqp_url, settings.namespace)) == burst


async def answer_head(reader: asyncio.StreamReader) -> bytes | None:
    """The status line already answered on a connection; None while it waits."""
    try:
        return (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 0.1)).split(b"\r\n")[0]
    except TimeoutError:
        return None


async def test_console_sign_in_is_throttled_per_client_address(settings, sources):
    async with running_ingress(settings, sources) as client:
        throttle = client.app[sign_in_throttle_key]
        waits = [await throttle.retry_after("198.51.100.1") for _ in range(6)]
        assert waits[:5] == [0.0] * 5 and waits[5] > 0
        assert await throttle.retry_after("198.51.100.2") == 0.0


async def test_concurrent_requests_share_one_bucket_across_limiters(settings):
    """Two limiters (as two processes) on the real Redis: however the
    concurrent requests are batched, exactly `burst` are allowed at once."""
    clients = [redis.from_url(settings.redis_urls[0]) for _ in range(2)]
    limiters = [RateLimiter(client, settings.namespace, ingress_rate_limit_local) for client in clients]
    try:
        waits = await asyncio.gather(*(limiters[n % 2].retry_after("source:x", 0.01, 25) for n in range(300)))
    finally:
        for limiter, client in zip(limiters, clients):
            await limiter.close()
            await client.aclose()
    assert sum(1 for wait in waits if wait == 0) == 25
    assert all(90 < wait <= 100 for wait in waits if wait)  # the next token, 1 / 0.01 s away


async def test_wrong_admin_tokens_spend_the_clients_failure_budget(settings, sources, monkeypatch):
    """A guesser of the admin token is refused like a webhook client failing
    verification: its budget spent, 429 before the token is looked at, the
    right token too; another client is served."""
    token = "admin-token-for-the-failure-budget-test"
    proxied = settings_with(
        monkeypatch, WEBHOOK_INGEST_TRUSTED_PROXIES="127.0.0.1/32", WEBHOOK_INGEST_ADMIN_TOKEN=token
    )
    guesser = {"X-Forwarded-For": "203.0.113.9"}
    async with running_ingress(proxied, sources) as client:
        statuses = [
            (await client.get("/admin/dead-letters", headers={**guesser, "Authorization": f"Bearer x{n}"})).status
            for n in range(FAILURES_BURST + 3)
        ]
        right = {"Authorization": f"Bearer {token}"}
        assert (await client.get("/admin/dead-letters", headers={**guesser, **right})).status == 429
        assert (
            await client.get("/admin/dead-letters", headers={"X-Forwarded-For": "203.0.113.10", **right})
        ).status == 200
    assert statuses == [401] * FAILURES_BURST + [429] * 3
