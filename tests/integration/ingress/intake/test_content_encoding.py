"""ingress/intake/content_encoding (and the form bound in intake/limits): a
body's Content-Encoding is decoded by the ingress, only for a webhook and
within its source's limit, never while draining a body answered early (issue 21)."""

import gzip
import json
import logging
import zlib

import pytest

from tests.support.ingress import running_ingress
from tests.support.preauth import (
    SECRET,
    aiohttp_errors,
    exchange,
    form_post,
    login_cookie_and_csrf,
    preauth_sources,
    settings_with,
)
from webhook_ingest.shared import signatures


@pytest.fixture
def sources(tmp_path):
    return preauth_sources(tmp_path)


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
