"""The ingress as a public endpoint, with real processes on loopback:
allowlists behind a trusted proxy, a rate limit shared by two ingress
processes, slow and idle clients cut off or shrugged off, and no secret in
any log line of a full run."""

import asyncio
import os
import re
import resource
import sys
import time

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from tests.support.ingress import queued_events
from tests.support.processes import count_rows, wait_until
from webhook_ingest.shared import signatures

SECRET = "public-endpoint-secret"
PROXY_ADDRESS = "127.0.0.2"  # loopback is all of 127/8: the "load balancer" connects from here


def source(
    name: str, extra: str = "", secret: str = SECRET, scheme: str = "hmac-sha256", handler: str = "inbox"
) -> str:
    return f'[sources.{name}]\nscheme = "{scheme}"\nsecrets = ["{secret}"]\nhandler = "{handler}"\n{extra}\n'


def signed(n: int, secret: str = SECRET, **extra_headers: str) -> tuple[bytes, dict[str, str]]:
    body = orjson.dumps({"id": f"evt_{n}"})
    return body, {**signatures.sign("hmac-sha256", body, secret), **extra_headers}


async def ready(base_url: str) -> None:
    """Until the broker confirms: /readyz is 200 through the outbox before
    that, and an event stored there is not on the queue yet."""

    async def answers() -> bool:
        try:
            async with aiohttp.ClientSession() as session, session.get(f"{base_url}/readyz") as response:
                return response.status == 200 and (await response.json())["via"] == "broker"
        except aiohttp.ClientError:
            return False

    await wait_until(answers, 60, message=f"{base_url} ready")


def start_ingress(fleet, tmp_path, sources: str, **env: str) -> str:
    path = tmp_path / "sources.toml"
    path.write_text(sources)
    _, base_url = fleet.ingress(env={"WEBHOOK_INGEST_SOURCES": str(path), **env})
    return base_url


async def post(session, url: str, n: int, **headers: str) -> int:
    body, signed_headers = signed(n, **headers)
    async with session.post(url, data=body, headers=signed_headers) as response:
        return response.status


async def test_allowlists_see_the_address_a_trusted_proxy_forwarded_and_nothing_else(fleet, tmp_path, settings):
    base_url = start_ingress(
        fleet,
        tmp_path,
        source("outside", 'allowed_ips = ["203.0.113.0/24"]') + source("inside", 'allowed_ips = ["127.0.0.1/32"]'),
        WEBHOOK_INGEST_TRUSTED_PROXIES=f"{PROXY_ADDRESS}/32",
    )
    await ready(base_url)
    via_proxy = aiohttp.TCPConnector(local_addr=(PROXY_ADDRESS, 0))
    async with aiohttp.ClientSession() as direct, aiohttp.ClientSession(connector=via_proxy) as proxy:
        assert await post(direct, f"{base_url}/webhooks/outside", 1) == 403
        assert await post(direct, f"{base_url}/webhooks/inside", 2) == 200
        assert await post(proxy, f"{base_url}/webhooks/outside", 3, **{"X-Forwarded-For": "203.0.113.7"}) == 200
        assert await post(proxy, f"{base_url}/webhooks/outside", 4, **{"X-Forwarded-For": "198.51.100.7"}) == 403
        # The same header from a peer that is not a trusted proxy is ignored.
        assert await post(direct, f"{base_url}/webhooks/outside", 5, **{"X-Forwarded-For": "203.0.113.7"}) == 403
    queued = await queued_events(settings.amqp_url, settings.namespace)
    assert sorted(event.key for event in queued) == ["inside:evt_2", "outside:evt_3"]


def counts(metrics_text: str, source_name: str) -> dict[str, float]:
    return {
        sample.labels["status"]: sample.value
        for family in text_string_to_metric_families(metrics_text)
        for sample in family.samples
        if sample.name == "webhook_ingress_requests_total" and sample.labels["source"] == source_name
    }


async def test_two_ingress_processes_share_one_rate_limit_and_other_sources_are_unaffected(fleet, tmp_path):
    sources = (
        source("limited", "rate_limit = { per_second = 100, burst = 100 }")
        + source("other", "rate_limit = { per_second = 100, burst = 100 }")
        + source("trickle", "rate_limit = { per_second = 1, burst = 20 }")
    )
    urls = [start_ingress(fleet, tmp_path, sources), start_ingress(fleet, tmp_path, sources)]
    for url in urls:
        await ready(url)
    answers: dict[str, list[tuple[int, str | None]]] = {"limited": [], "other": [], "trickle": []}

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:

        async def send(name: str, n: int) -> None:
            body, headers = signed(n)
            async with session.post(f"{urls[n % 2]}/webhooks/{name}", data=body, headers=headers) as response:
                answers[name].append((response.status, response.headers.get("Retry-After")))

        started = time.monotonic()
        await asyncio.gather(
            *(send("limited", n) for n in range(1000)),
            *(send("other", n) for n in range(50)),
            *(send("trickle", n) for n in range(100)),
        )
        elapsed = time.monotonic() - started
        per_process = [counts(await (await session.get(f"{url}/metrics")).text(), "trickle") for url in urls]

    accepted = {name: sum(1 for status, _ in statuses if status == 200) for name, statuses in answers.items()}
    refused = [(status, wait) for statuses in answers.values() for status, wait in statuses if status != 200]
    assert all(status == 429 and int(wait) >= 1 for status, wait in refused), set(refused)
    # One bucket for both processes: the burst plus what refilled while
    # sending (a bucket in each would admit twice the burst at once).
    assert 100 <= accepted["limited"] <= 100 + 100 * elapsed + 5, (accepted, elapsed)
    assert 20 <= accepted["trickle"] <= 20 + 1 * elapsed + 1, (accepted, elapsed)
    assert [sum(process.values()) for process in per_process] == [50, 50]  # both processes answered
    assert accepted["other"] == 50


async def raw_request_head(
    port: int, path: str, content_length: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {content_length}\r\n\r\n".encode())
    await writer.drain()
    return reader, writer


async def dribble(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> tuple[int, bytes]:
    """Sends `data` one byte a second until the server hangs up:
    (bytes sent, what the server answered before closing)."""
    sent, answer = 0, b""
    while sent < len(data):
        try:
            chunk = await asyncio.wait_for(reader.read(65536), timeout=1.0)
        except TimeoutError:
            try:
                writer.write(data[sent : sent + 1])
                await writer.drain()
            except ConnectionError:
                break
            sent += 1
            continue
        except ConnectionError:  # hung up with a reset: our byte sent after its close made the kernel send one
            break
        if not chunk:
            break
        answer += chunk
    return sent, answer


async def test_slow_clients_are_cut_off_and_others_are_served_meanwhile(fleet, tmp_path):
    base_url = start_ingress(
        fleet, tmp_path, source("inside"), WEBHOOK_INGEST_BODY_TIMEOUT="2", WEBHOOK_INGEST_HEADER_TIMEOUT="3"
    )
    await ready(base_url)
    port = int(base_url.rsplit(":", 1)[1])
    body_reader, body_writer = await raw_request_head(port, "/webhooks/inside", 60)
    head_reader, head_writer = await asyncio.open_connection("127.0.0.1", port)
    head_writer.write(b"POST /webhooks/inside HTTP/1.1\r\n")

    async def served_meanwhile() -> list[int]:
        async with aiohttp.ClientSession() as session:
            return [await post(session, f"{base_url}/webhooks/inside", n) for n in range(5)]

    (body_sent, body_answer), (head_sent, head_answer), statuses = await asyncio.gather(
        dribble(body_reader, body_writer, b"x" * 60),
        dribble(head_reader, head_writer, b"X-Slow: " + b"y" * 52),
        served_meanwhile(),
    )
    assert body_sent < 60 and body_answer.startswith(b"HTTP/1.1 408")  # and closed, the body unfinished
    assert body_answer.endswith(b'{"error":"request_timeout"}')
    assert head_sent < 60 and head_answer == b""  # closed before the headers were complete
    assert statuses == [200] * 5
    for writer in (body_writer, head_writer):
        writer.close()


async def test_two_thousand_idle_connections_do_not_stop_the_ingress(fleet, tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 2500 <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (2500, hard))
    base_url = start_ingress(fleet, tmp_path, source("inside"))
    await ready(base_url)
    port = int(base_url.rsplit(":", 1)[1])
    idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2000)]
    try:
        async with aiohttp.ClientSession() as session:
            assert [await post(session, f"{base_url}/webhooks/inside", n) for n in range(5)] == [200] * 5
    finally:
        for _, writer in idle:
            writer.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_no_secret_or_token_reaches_a_log_line_or_a_metric(fleet, tmp_path, service_env, settings):
    secret_file = tmp_path / "stripe-secret"
    secret_file.write_text("whsec_from_a_file_7Qm2\n")
    secrets = {
        "literal": "literal-secret-9Xr4",
        "fromenv": "env-secret-3Kp8",
        "fromfile": "whsec_from_a_file_7Qm2",
        "dead": "dead-letter-secret-5Tz1",
        "admin": "admin-token-2Wq6-of-the-public-endpoint-test",
        "viewer": "viewer-token-8Jd3-of-the-public-endpoint-test",
    }
    sources = (
        source("literal", secret=secrets["literal"])
        + source("fromenv", secret="env:FROMENV_SECRET", scheme="github")
        + source("fromfile", secret=f"file:{secret_file}", scheme="stripe")
        + source("dead", "max_attempts = 1", secret=secrets["dead"], handler="tests.support.handlers:permanently_fails")
    )
    env = {
        "FROMENV_SECRET": secrets["fromenv"],
        "WEBHOOK_INGEST_ADMIN_TOKEN": secrets["admin"],
        "WEBHOOK_INGEST_VIEWER_TOKEN": secrets["viewer"],
    }
    base_url = start_ingress(fleet, tmp_path, sources, **env)
    fleet.worker(env={"WEBHOOK_INGEST_SOURCES": str(tmp_path / "sources.toml"), **env})
    await ready(base_url)

    outputs = [
        await send_test(
            name, base_url, {**service_env, **env, "WEBHOOK_INGEST_SOURCES": str(tmp_path / "sources.toml")}
        )
        for name in ("literal", "fromenv", "fromfile", "dead")
    ]
    async with aiohttp.ClientSession() as session:
        assert await post(session, f"{base_url}/webhooks/literal", 1, **{"X-Signature": "sha256=" + "0" * 64}) == 401
        async with session.get(f"{base_url}/admin/dead-letters", headers={"Authorization": "Bearer wrong"}) as response:
            assert response.status == 401
        await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 60, message="a dead letter")
        await wait_until(lambda: count_rows(settings.database_url, "inbox"), 60, message="an inbox row")
        async with session.get(
            f"{base_url}/admin/dead-letters", headers={"Authorization": f"Bearer {secrets['admin']}"}
        ) as response:
            assert response.status == 200
        # The console keeps its session in a cookie: a jar that accepts one from an IP host.
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
            assert [await console_sign_in(browser, base_url, token) for token in ("wrong", secrets["viewer"])] == [
                401,
                303,
            ]
        metrics_text = await (await session.get(f"{base_url}/metrics")).text()
    fleet.stop_all()

    logs = [(process.log_path.name, line) for process in fleet.processes for line in process.output().splitlines()]
    logs += [("send-test", line) for output in outputs for line in output.splitlines()]
    assert any("signature_rejected" in line for _, line in logs)
    for name, secret in secrets.items():
        assert not [where for where, line in logs if secret in line], f"the {name} secret is in a log line"
        assert secret not in metrics_text


async def console_sign_in(session: aiohttp.ClientSession, base_url: str, token: str) -> int:
    async with session.get(f"{base_url}/console/login") as page:
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', await page.text())
    form = {"token": token, "csrf_token": csrf[1] if csrf else ""}
    async with session.post(f"{base_url}/console/login", data=form, allow_redirects=False) as response:
        return response.status


async def send_test(source_name: str, base_url: str, env: dict[str, str]) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "webhook_ingest",
        "send-test",
        source_name,
        "--url",
        base_url,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output = (await process.communicate())[0].decode()
    assert process.returncode == 0 and "accepted" in output, output
    return output
