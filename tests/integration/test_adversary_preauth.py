"""What an attacker without a secret or a token can do to the ingress (issue 21,
"a second read of every pre-authentication code path"): the real app
against the real services, each finding a test that failed before its fix."""

import asyncio
import base64
import gzip
import hashlib
import hmac
import json
import logging
import re
import zlib
from collections import Counter
from urllib.parse import urlencode

import pytest

from tests.support.ingress import running_ingress
from tests.support.logs import captured_logs
from tests.support.signing import PROVIDERS, TWILIO_URL
from tests.support.tcpproxy import free_port
from webhook_ingest.ingress.console.security import COOKIE_NAME
from webhook_ingest.ingress.intake.failure_budget import FAILURES_BURST
from webhook_ingest.shared import signatures
from webhook_ingest.shared.event import payloads
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.signatures import twilio
from webhook_ingest.shared.sources.model import load_sources

OPERATOR = "operator-token-for-the-adversary-tests-0123456789"
SECRET = "adversary-secret"
MAX_FORM_FIELDS = payloads.MAX_FORM_FIELDS


@pytest.fixture
def sources(tmp_path):
    path = tmp_path / "sources.toml"
    path.write_text(
        f'[sources.open]\nscheme = "hmac-sha256"\nsecrets = ["{SECRET}"]\nhandler = "inbox"\n'
        f"max_body_bytes = 65536\n"
        f'[sources.office]\nscheme = "hmac-sha256"\nsecrets = ["{SECRET}"]\nhandler = "inbox"\n'
        'allowed_ips = ["10.1.2.0/24"]\n'
        f'[sources.twilio]\nscheme = "twilio"\nsecrets = ["{PROVIDERS["twilio"].source_secret}"]\n'
        f'handler = "inbox"\npublic_url = "{TWILIO_URL}"\n'
    )
    return load_sources(str(path))


def settings_with(monkeypatch, **env: str) -> Settings:
    for name, value in {"WEBHOOK_INGEST_ADMIN_TOKEN": OPERATOR, **env}.items():
        monkeypatch.setenv(name, value)
    return Settings()


async def exchange(port: int, head: bytes, body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """One request written byte for byte (aiohttp's client sends neither obs-text nor junk); the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head.replace(b"\n", b"\r\n") + b"Connection: close\r\n\r\n" + body)
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    header_block, _, content = rest.partition(b"\r\n\r\n")
    headers = dict(line.decode("latin-1").split(": ", 1) for line in header_block.split(b"\r\n") if b": " in line)
    return int(status_line.split()[1]), headers, content


async def login_cookie_and_csrf(client) -> tuple[str, str]:
    page = await (await client.get("/console/login")).text()
    cookie = next(cookie.value for cookie in client.session.cookie_jar if cookie.key == COOKIE_NAME)
    return f"{COOKIE_NAME}={cookie}", re.search(r'name="csrf_token" value="([^"]+)"', page)[1]


def form_post(cookie: str, content_type: bytes, body: bytes, *extra: bytes) -> tuple[bytes, bytes]:
    head = (
        b"POST /console/login HTTP/1.1\nHost: x\nCookie: "
        + cookie.encode()
        + b"\nContent-Type: "
        + content_type
        + b"\nContent-Length: "
        + str(len(body)).encode()
        + b"\n"
        + b"".join(line + b"\n" for line in extra)
    )
    return head, body


# -- malformed input is refused, never a 500 ---------------------------------------


async def test_malformed_sign_in_and_bearer_input_is_refused_never_a_500(settings, sources, monkeypatch):
    """Bytes that are not UTF-8 in the bearer token or the CSRF header, a form
    in an unknown charset or not UTF-8, a multipart form, an Origin that is not
    a URL: each raised out of the handler (500, and a traceback per request)."""
    async with running_ingress(settings_with(monkeypatch), sources) as client:
        cookie, csrf = await login_cookie_and_csrf(client)
        form = f"csrf_token={csrf}&token=guess".encode()
        multipart = (
            b'--b\r\nContent-Disposition: form-data; name="csrf_token"\r\n\r\n'
            + csrf.encode()
            + b'\r\n--b\r\nContent-Disposition: form-data; name="token"\r\n\r\nguess\r\n--b--\r\n'
        )
        attempts = {
            "bearer": (b"GET /admin/dead-letters HTTP/1.1\nHost: x\nAuthorization: Bearer \xff\xfe\n", b""),
            "csrf header": form_post(cookie, b"application/x-www-form-urlencoded", form, b"X-CSRF-Token: \xff"),
            "charset": form_post(cookie, b"application/x-www-form-urlencoded; charset=no-such-charset", form),
            "not utf-8": form_post(cookie, b"application/x-www-form-urlencoded", form + b"\xff"),
            "multipart": form_post(cookie, b"multipart/form-data; boundary=b", multipart),
            "no boundary": form_post(cookie, b"multipart/form-data", multipart),
            "origin": form_post(cookie, b"application/x-www-form-urlencoded", form, b"Origin: http://[::1"),
        }
        answers = {name: (await exchange(client.port, *attempt))[0] for name, attempt in attempts.items()}
    assert answers == {
        "bearer": 401,
        "csrf header": 403,
        "charset": 403,
        "not utf-8": 403,
        "multipart": 403,
        "no boundary": 403,
        "origin": 403,
    }


async def test_with_postgres_away_the_sign_in_page_is_a_503_not_a_500(settings, sources, monkeypatch):
    """The console answers 503 when Postgres is away (docs/security.md); the
    sign-in page's cookie needs the key kept there, and asking for it only
    when the cookie was written raised past every handler."""
    away = settings_with(monkeypatch, DATABASE_URL=f"postgresql://postgres@127.0.0.1:{free_port()}/nothing")
    async with running_ingress(away, sources) as client:
        page = await client.get("/console/login")
        assert page.status == 503 and "PostgreSQL is unreachable" in await page.text()
        assert (await client.get("/console/", allow_redirects=True)).status == 503


# -- compressed bodies -------------------------------------------------------------


def aiohttp_errors(caplog) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name.startswith("aiohttp") and record.levelno >= logging.ERROR
    ]


async def test_a_body_answered_before_it_is_read_is_never_decompressed(settings, sources, monkeypatch, caplog):
    """aiohttp decoded a Content-Encoding for every request, also while it
    drained the body of one answered early (404, 403, 429: up to 10 s of
    "lingering"): a 0.5 MB gzip of 512 MB of zeros to an unknown source
    cost ~0.35 s of the event loop's CPU after its 404, with nothing
    charged to the client. A stream that does not decode shows it: its
    error was raised while draining, an error log with a traceback each."""
    caplog.set_level(logging.ERROR, logger="aiohttp")
    broken = gzip.compress(b'{"id": "x"}' * 1000)[:-40] + b"\x00" * 64
    requests = {"POST /webhooks/no-such-source": 404, "POST /healthz": 405, "GET /console/login": 200}
    async with running_ingress(settings_with(monkeypatch), sources) as client:
        answers = {}
        for request in requests:
            head = f"{request} HTTP/1.1\nHost: x\nContent-Encoding: gzip\nContent-Length: {len(broken)}\n"
            answers[request] = (await exchange(client.port, head.encode(), broken))[0]
        head = f"POST /webhooks/open HTTP/1.1\nHost: x\nContent-Encoding: br\nContent-Length: {len(broken)}\n"
        status, _, content = await exchange(client.port, head.encode(), broken)
    assert answers == requests
    assert (status, content) == (400, b'{"error":"invalid_json"}')  # was aiohttp's own text/plain 400
    assert aiohttp_errors(caplog) == []


async def test_a_compressed_console_form_is_refused(settings, sources, monkeypatch):
    """The 64 KiB bound of a console form was checked against Content-Length,
    and aiohttp then decoded the gzip body up to the app's client_max_size:
    960 bytes on the wire were read as a 900 KiB form. No browser compresses a form."""
    async with running_ingress(settings_with(monkeypatch), sources) as client:
        cookie, csrf = await login_cookie_and_csrf(client)
        form = gzip.compress(f"csrf_token={csrf}&token=".encode() + b"A" * (900 * 1024))
        head, body = form_post(cookie, b"application/x-www-form-urlencoded", form, b"Content-Encoding: gzip")
        assert (await exchange(client.port, head, body))[0] == 415


async def test_a_webhook_body_is_still_decoded_within_its_limit(settings, sources, monkeypatch):
    """What must keep working: a gzip or deflate body is verified and parsed decoded,
    and one that decodes past the source's limit is a 413."""
    async with running_ingress(settings_with(monkeypatch), sources) as client:
        for n, (encoding, compress) in enumerate([("gzip", gzip.compress), ("deflate", zlib.compress)]):
            plain = json.dumps({"id": f"evt_{n}"}).encode()
            headers = {**signatures.sign("hmac-sha256", plain, SECRET), "Content-Encoding": encoding}
            answer = await client.post("/webhooks/open", data=compress(plain), headers=headers)
            assert (answer.status, await answer.json()) == (200, {"status": "accepted", "key": f"open:evt_{n}"})
        bomb = gzip.compress(b" " * (16 * 1024 * 1024))  # 16 KB on the wire, under the limit
        head = f"POST /webhooks/open HTTP/1.1\nHost: x\nContent-Encoding: gzip\nContent-Length: {len(bomb)}\n"
        status, _, content = await exchange(client.port, head.encode(), bomb)
        assert (status, json.loads(content)) == (413, {"error": "body_too_large"})


# -- who a client is ---------------------------------------------------------------


async def test_the_addresses_of_one_ipv6_network_are_one_client(settings, sources, monkeypatch):
    """Anyone with IPv6 holds a /64 at least (2^64 addresses) and may send from
    any of them: counted per address, the failure budget and the sign-in
    throttle never refused one such client."""
    proxied = settings_with(monkeypatch, WEBHOOK_INGEST_TRUSTED_PROXIES="127.0.0.1/32")
    async with running_ingress(proxied, sources) as client:
        failures = [
            (
                await client.post("/webhooks/open", data=b"{}", headers={"X-Forwarded-For": f"2001:db8:1:2::{n:x}"})
            ).status
            for n in range(1, FAILURES_BURST + 4)
        ]
        neighbour = await client.post("/webhooks/open", data=b"{}", headers={"X-Forwarded-For": "2001:db8:1:3::1"})
        _, csrf = await login_cookie_and_csrf(client)
        sign_ins = [
            (
                await client.post(
                    "/console/login",
                    data={"csrf_token": csrf, "token": "guess"},
                    headers={"X-Forwarded-For": f"2001:db8:7:7:{n:x}::1"},
                )
            ).status
            for n in range(1, 11)
        ]
    assert failures == [401] * FAILURES_BURST + [429] * 3
    assert neighbour.status == 401  # another /64 is another client
    assert sign_ins == [401] * 5 + [429] * 5


async def test_metrics_are_served_only_to_the_networks_allowed(settings, sources, monkeypatch):
    """/metrics shares the public port with /webhooks: anyone could read each
    source's deliveries per status as they happen (a payment provider's
    volume, minute by minute), the dead letters open, the incidents."""
    proxied = settings_with(monkeypatch, WEBHOOK_INGEST_TRUSTED_PROXIES="127.0.0.1/32")
    async with running_ingress(proxied, sources) as client:
        internet = await client.get("/metrics", headers={"X-Forwarded-For": "203.0.113.9"})
        assert (internet.status, await internet.json()) == (403, {"error": "forbidden_client_ip"})
        assert (await client.get("/metrics", headers={"X-Forwarded-For": "10.1.2.3"})).status == 200
        assert (await client.get("/metrics")).status == 200  # the peer itself, on loopback
        assert (await client.get("/readyz", headers={"X-Forwarded-For": "203.0.113.9"})).status == 200
    chosen = settings_with(
        monkeypatch, WEBHOOK_INGEST_TRUSTED_PROXIES="127.0.0.1/32", WEBHOOK_INGEST_METRICS_ALLOWED_IPS="198.51.100.0/24"
    )
    async with running_ingress(chosen, sources) as client:
        assert (await client.get("/metrics", headers={"X-Forwarded-For": "198.51.100.7"})).status == 200
        assert (await client.get("/metrics", headers={"X-Forwarded-For": "10.1.2.3"})).status == 403


@pytest.mark.parametrize("header", ["X-Forwarded-For", "Forwarded"])
async def test_the_secure_cookie_follows_the_header_the_proxy_manages(settings, sources, monkeypatch, header):
    """`came_over_https` read `Forwarded` (its leftmost element: the client's)
    before `X-Forwarded-Proto`, whichever header the proxy manages."""
    proxied = settings_with(
        monkeypatch, WEBHOOK_INGEST_TRUSTED_PROXIES="127.0.0.1/32", WEBHOOK_INGEST_CLIENT_ADDRESS_HEADER=header
    )
    if header == "X-Forwarded-For":  # nginx: X-Forwarded-Proto its own, a client's Forwarded passed through
        over_https = {"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https", "Forwarded": "proto=http"}
        over_http = {"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "http", "Forwarded": "proto=https"}
    else:  # a proxy appending its Forwarded element, a client's X-Forwarded-Proto passed through
        over_https = {
            "Forwarded": "for=198.51.100.1;proto=http, for=203.0.113.9;proto=https",
            "X-Forwarded-Proto": "http",
        }
        over_http = {
            "Forwarded": "for=198.51.100.1;proto=https, for=203.0.113.9;proto=http",
            "X-Forwarded-Proto": "https",
        }
    async with running_ingress(proxied, sources) as client:
        secure = (await client.get("/console/login", headers=over_https)).headers["Set-Cookie"]
        client.session.cookie_jar.clear()
        plain = (await client.get("/console/login", headers=over_http)).headers["Set-Cookie"]
    assert "; Secure" in secure and "; Secure" not in plain


# -- work an unsigned request can cost ---------------------------------------------


async def test_a_form_of_more_fields_than_any_provider_sends_is_refused_unparsed(settings, sources, monkeypatch):
    """twilio signs the decoded fields, so its verifier parses (and sorts) the
    form before any HMAC: 1 MiB of `a=&` took ~0.45 s of the event loop per
    unsigned request (an HMAC over it ~1 ms). Over MAX_FORM_FIELDS a form
    is refused before it is parsed — here even a correctly signed one."""
    fields = [("MessageSid", "SM1"), *((f"f{n}", "") for n in range(MAX_FORM_FIELDS))]
    async with running_ingress(settings_with(monkeypatch), sources) as client:
        over = await client.post("/webhooks/twilio", data=urlencode(fields), headers=twilio_signed(fields))
        assert (over.status, await over.json()) == (401, {"error": "invalid_signature"})
        fitting = fields[:MAX_FORM_FIELDS]
        assert (
            await client.post("/webhooks/twilio", data=urlencode(fitting), headers=twilio_signed(fitting))
        ).status == 200


def twilio_signed(fields: list[tuple[str, str]]) -> dict[str, str]:
    """Twilio's headers for a form of distinct names, signed by hand (`sign` parses the form, and refuses this one)."""
    signed_text = TWILIO_URL.encode() + twilio.signed_fields(dict(fields))
    digest = hmac.new(PROVIDERS["twilio"].source_secret.encode(), signed_text, hashlib.sha1).digest()
    return {"X-Twilio-Signature": base64.b64encode(digest).decode(), "Content-Type": payloads.FORM}


# -- the log -----------------------------------------------------------------------


async def test_a_malformed_request_is_a_400_and_no_error_in_the_log(settings, sources, monkeypatch, caplog):
    """aiohttp answers a request it cannot parse with 400 and logged each one
    at ERROR with a traceback: anyone, with a few bytes and no budget to
    spend, wrote an error into the log (scanners do it all day)."""
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    malformed = [
        b"GET / HTTP/1.1\nHost: x\nX-Note: \x7f\n",
        b"GET /" + b"a" * 9000 + b" HTTP/1.1\nHost: x\n",
        b"POST /webhooks/open HTTP/1.1\nHost: x\nContent-Length: 1\nContent-Length: 2\n",
    ]
    async with running_ingress(settings_with(monkeypatch), sources) as client:
        statuses = [(await exchange(client.port, request))[0] for request in malformed]
    assert statuses == [400, 400, 400]
    assert aiohttp_errors(caplog) == []


async def test_a_client_refused_again_and_again_is_logged_once_a_minute(settings, sources, monkeypatch):
    """A client over its failure budget, or outside a source's allowlist, was
    logged on every refused request: no budget bounds those (the 429 and the
    403 are answered before anything is spent), so one client wrote a log
    line per few bytes sent, for ever. The counters count every one."""
    async with running_ingress(settings_with(monkeypatch), sources) as client:
        before = await refusals_counted(client)
        with captured_logs() as logs:
            for _ in range(FAILURES_BURST + 30):
                await client.post("/webhooks/open", data=b"{}")
            for _ in range(30):
                await client.post("/webhooks/office", data=b"{}")
        after = await refusals_counted(client)
    events = Counter(line["event"] for line in logs)
    assert events["too_many_failures"] == 1 and events["forbidden_source_ip"] == 1
    assert after - before == Counter({("open", "429"): 30, ("office", "403"): 30})


async def refusals_counted(client) -> Counter:
    """webhook_ingress_requests_total of the 403s and 429s, by (source, status): the process's counters."""
    text = await (await client.get("/metrics")).text()
    found = re.findall(r'webhook_ingress_requests_total\{source="(\w+)",status="(403|429)"\} ([0-9.]+)', text)
    return Counter({(source, status): int(float(value)) for source, status, value in found})
