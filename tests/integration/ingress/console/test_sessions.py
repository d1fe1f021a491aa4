"""The console's sessions against an attacker without the token (issue 21,
items 4-6): nothing in a cookie confirms a guess of the token, signing out
ends a session everywhere, and the console's requests are bounded like the
webhooks'. The real ingress app against the real services."""

import asyncio
import base64
from collections import Counter

import asyncpg
import pytest
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from tests.support.console import signed_in
from tests.support.dead_letters import seed_dead_letters
from tests.support.ingress import running_ingress, status_lines_once_answered
from webhook_ingest.ingress.console.security import COOKIE_NAME
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources

OPERATOR = "operator-token-for-the-session-tests-0123456789"
ROTATED = "a-rotated-operator-token-for-the-session-tests"


def settings_with(monkeypatch, **env: str) -> Settings:
    for name, value in {"WEBHOOK_INGEST_ADMIN_TOKEN": OPERATOR, **env}.items():
        monkeypatch.setenv(name, value)
    return Settings()


def session_cookie(client) -> str:
    return next(cookie.value for cookie in client.session.cookie_jar if cookie.key == COOKIE_NAME)


def token_derived_fernet(token: str) -> Fernet:
    """The key the console used to derive from the operator token: HKDF, no salt."""
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"webhook-ingest console session v1").derive(
        token.encode()
    )
    return Fernet(base64.urlsafe_b64encode(key))


async def dead_letter_status(database_url: str, dead_letter_id: int) -> str:
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetchval("SELECT status FROM dead_letters WHERE id = $1", dead_letter_id)
    finally:
        await connection.close()


async def test_an_anonymous_cookie_confirms_no_guess_of_the_token(settings, monkeypatch):
    """The cookie `GET /console/login` hands anyone must not open under any
    key computable from the token: that made the token guessable offline."""
    console = settings_with(monkeypatch)
    async with running_ingress(console, load_sources(None)) as client:
        assert (await client.get("/console/login")).status == 200
        cookie = session_cookie(client)
    with pytest.raises(InvalidToken):
        token_derived_fernet(OPERATOR).decrypt(cookie.encode())


async def test_two_ingress_processes_share_a_session(settings, monkeypatch):
    """`--reuse-port`: a sign-in served by one process is good in the others."""
    console = settings_with(monkeypatch)
    async with (
        running_ingress(console, load_sources(None)) as first,
        running_ingress(console, load_sources(None)) as second,
    ):
        await signed_in(first, OPERATOR)
        second.session.cookie_jar.update_cookies({COOKIE_NAME: session_cookie(first)})
        page = await second.get("/console/dead-letters", allow_redirects=False)
        assert page.status == 200 and "Dead letters" in await page.text()


async def test_a_copied_cookie_can_do_nothing_after_sign_out(settings, monkeypatch):
    console = settings_with(monkeypatch)
    [dead] = await seed_dead_letters(console.database_url, "acme", 1)
    async with (
        running_ingress(console, load_sources(None)) as browser,
        running_ingress(console, load_sources(None)) as thief,
    ):
        csrf = await signed_in(browser, OPERATOR)
        stolen = session_cookie(browser)
        thief.session.cookie_jar.update_cookies({COOKIE_NAME: stolen})
        signed_out = await browser.post("/console/logout", data={"csrf_token": csrf})
        assert signed_out.status == 200 and "Sign in" in await signed_out.text()

        page = await thief.get("/console/dead-letters", allow_redirects=False)
        assert page.status == 303 and page.headers["Location"].startswith("/console/login")
        thief.session.cookie_jar.update_cookies({COOKIE_NAME: stolen})  # the refusal above cleared it
        discard = await thief.post(f"/console/dead-letters/{dead}/discard", data={"csrf_token": csrf})
        assert discard.status == 403
    assert await dead_letter_status(console.database_url, dead) == "dead"


async def test_rotating_the_operator_token_ends_its_sessions(settings, monkeypatch):
    console = settings_with(monkeypatch)
    async with running_ingress(console, load_sources(None)) as before:
        await signed_in(before, OPERATOR)
        cookie = session_cookie(before)
    rotated = settings_with(monkeypatch, WEBHOOK_INGEST_ADMIN_TOKEN=ROTATED)
    async with running_ingress(rotated, load_sources(None)) as after:
        after.session.cookie_jar.update_cookies({COOKIE_NAME: cookie})
        page = await after.get("/console/dead-letters", allow_redirects=False)
        assert page.status == 303 and page.headers["Location"].startswith("/console/login")
        await signed_in(after, ROTATED)


async def raw_post(port: int, path: str, length: int, first_bytes: bytes, client_address: str = "127.0.0.1"):
    """A POST whose headers are sent with only `first_bytes` of a body of `length`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(client_address, 0))
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {length}\r\n\r\n".encode()
        + first_bytes
    )
    await writer.drain()
    return reader, writer


async def status_line(reader: asyncio.StreamReader, within: float) -> bytes:
    return (await asyncio.wait_for(reader.readuntil(b"\r\n"), within)).strip()


async def test_the_sign_in_post_has_the_webhooks_time_and_size_limits(settings, monkeypatch):
    console = settings_with(monkeypatch, WEBHOOK_INGEST_BODY_TIMEOUT="1")
    async with running_ingress(console, load_sources(None)) as client:
        reader, writer = await raw_post(client.port, "/console/login", 100, b"token=")
        try:
            assert await status_line(reader, within=5) == b"HTTP/1.1 408 Request Timeout"
        finally:
            writer.close()
        reader, writer = await raw_post(client.port, "/console/login", 50 * 1024 * 1024, b"token=")
        try:
            assert await status_line(reader, within=5) == b"HTTP/1.1 413 Request Entity Too Large"
        finally:
            writer.close()


async def test_console_requests_count_against_the_clients_bodies_and_the_bound(settings, monkeypatch):
    bounded = settings_with(
        monkeypatch, WEBHOOK_INGEST_MAX_CONCURRENT_REQUESTS="10", WEBHOOK_INGEST_MAX_BODIES_PER_CLIENT="3"
    )
    async with running_ingress(bounded, load_sources(None)) as client:
        slow = [await raw_post(client.port, "/console/login", 100, b"t", "127.0.0.3") for _ in range(5)]
        try:
            heads = await status_lines_once_answered([reader for reader, _ in slow], answered=2)
            assert (await client.get("/console/login")).status == 200  # another client is served
        finally:
            for _, writer in slow:
                writer.close()
    assert Counter(heads) == {b"HTTP/1.1 429 Too Many Requests": 2, None: 3}
