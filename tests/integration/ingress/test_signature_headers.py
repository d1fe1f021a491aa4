"""Signature headers are not shown to viewers; operators see them on request (issue 36;
docs/security.md "The event archive").

With a signature and its body, anyone may post the request again: the
viewer token reads the archive and the dead letters, so the admin API and
the console show it every header but the signature ones, whose values are
hidden. The operator token sees them only by asking (`?signatures=show`),
for provenance after an incident; the viewer asking is refused.
"""

import json

import asyncpg
import pytest

from tests.support.archive import archived_event, minutes_ago, seed_archive
from tests.support.dead_letters import failure
from tests.support.ingress import console_login, running_ingress
from webhook_ingest.shared.dead_letters.model import record_dead_letter
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources

OPERATOR = "operator-token-of-the-signature-headers-tests"
VIEWER = "viewer-token-of-the-signature-headers-tests"
SIGNATURE = "sha256=6113728f27ae82c7b1a177c8d03f9e96e0adf246aaaaaaaaaaaaaaaaaaaaaaaa"
HEADERS = {
    "content-type": "application/json",
    "x-github-event": "push",
    "x-hub-signature-256": SIGNATURE,
    "x-hub-signature": "sha1=0123456789abcdef0123456789abcdef01234567",
}


@pytest.fixture
def admin_settings(settings, monkeypatch) -> Settings:
    monkeypatch.setenv("WEBHOOK_INGEST_ADMIN_TOKEN", OPERATOR)
    monkeypatch.setenv("WEBHOOK_INGEST_VIEWER_TOKEN", VIEWER)
    return Settings()


@pytest.fixture
async def push(admin_settings) -> int:
    """An archived GitHub push, and its dead letter: the id of the dead letter."""
    event = archived_event("github", "d-1", minutes_ago(5), "push", headers=HEADERS)
    await seed_archive(admin_settings.database_url, [event])
    connection = await asyncpg.connect(admin_settings.database_url)
    try:
        return await record_dead_letter(connection, event, [failure(1)])
    finally:
        await connection.close()


async def admin_get(client, path: str, token: str) -> tuple[int, dict]:
    response = await client.get(path, headers={"Authorization": f"Bearer {token}"})
    return response.status, await response.json()


async def test_the_admin_api_hides_signature_headers_unless_the_operator_asks(admin_settings, push):
    async with running_ingress(admin_settings, load_sources(None)) as client:
        for token in (VIEWER, OPERATOR):
            status, event = await admin_get(client, "/admin/events/github:d-1", token)
            assert status == 200
            [arrival] = event["arrivals"]
            assert arrival["headers"]["x-github-event"] == "push"
            assert SIGNATURE not in json.dumps(event) and "sha1=" not in json.dumps(event)
            status, letter = await admin_get(client, f"/admin/dead-letters/{push}", token)
            assert status == 200 and letter["headers"]["x-github-event"] == "push"
            assert SIGNATURE not in json.dumps(letter)
        status, event = await admin_get(client, "/admin/events/github:d-1?signatures=show", OPERATOR)
        assert event["arrivals"][0]["headers"]["x-hub-signature-256"] == SIGNATURE
        status, letter = await admin_get(client, f"/admin/dead-letters/{push}?signatures=show", OPERATOR)
        assert letter["headers"]["x-hub-signature-256"] == SIGNATURE
        assert (await admin_get(client, "/admin/events/github:d-1?signatures=show", VIEWER)) == (
            403,
            {"error": "forbidden"},
        )


async def test_the_console_hides_signature_headers_from_viewers(admin_settings, push):
    async with running_ingress(admin_settings, load_sources(None)) as client:
        await console_login(client, VIEWER)
        for path in ("/console/events/github:d-1", f"/console/dead-letters/{push}"):
            page = await (await client.get(path)).text()
            assert "x-github-event" in page and SIGNATURE not in page, path
            assert 'href="?signatures=show"' not in page  # the operator's link
        assert (await client.get("/console/events/github:d-1?signatures=show")).status == 403
    async with running_ingress(admin_settings, load_sources(None)) as client:
        await console_login(client, OPERATOR)
        for path in ("/console/events/github:d-1", f"/console/dead-letters/{push}"):
            page = await (await client.get(path)).text()
            assert SIGNATURE not in page and 'href="?signatures=show"' in page
            assert SIGNATURE in await (await client.get(path + "?signatures=show")).text()
