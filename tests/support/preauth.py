"""The ingress as an attacker without a secret or a token reaches it (issue 21):
its sources and settings, requests written byte for byte, the console's
sign-in form, aiohttp's error log. Shared by tests/integration/: ingress/
test_client_address.py, test_health.py and test_server_log.py,
ingress/console/test_security.py, ingress/intake/test_content_encoding.py
and test_refusals.py, shared/event/test_payloads.py."""

import asyncio
import logging
import re

from tests.support.signing import PROVIDERS, TWILIO_URL
from webhook_ingest.ingress.console.security import COOKIE_NAME
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources

OPERATOR = "operator-token-for-the-adversary-tests-0123456789"
SECRET = "adversary-secret"


def preauth_sources(tmp_path):
    """Three sources: `open`, `office` (an allowlist of 10.1.2.0/24), `twilio`."""
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


def aiohttp_errors(caplog) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name.startswith("aiohttp") and record.levelno >= logging.ERROR
    ]
