"""Who did what to which dead letters (docs/reference.md §8.1): the admin
API's viewer token, and the audit log and replay history written by the
admin API and the CLI. The console's own pages are in
tests/acceptance/test_console.py."""

import asyncio

import asyncpg
import pytest
from click.testing import CliRunner

from tests.support.dead_letters import seed_dead_letters
from tests.support.ingress import running_ingress
from webhook_ingest.cli.main import main
from webhook_ingest.shared.audit.actor import os_user
from webhook_ingest.shared.dead_letters.store import DeadLetterStore
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources

OPERATOR = "operator-token-for-the-audit-tests"
VIEWER = "viewer-token-for-the-audit-tests"


@pytest.fixture
def both_tokens(settings, monkeypatch) -> Settings:
    monkeypatch.setenv("WEBHOOK_INGEST_ADMIN_TOKEN", OPERATOR)
    monkeypatch.setenv("WEBHOOK_INGEST_VIEWER_TOKEN", VIEWER)
    return Settings()


async def audit_and_history(database_url: str, dead_letter_id: int) -> tuple[list[dict], list[dict]]:
    connection = await asyncpg.connect(database_url)
    try:
        store = DeadLetterStore(connection)
        return await store.audit_log.entries(), await store.replays_of(dead_letter_id)
    finally:
        await connection.close()


async def test_the_viewer_token_may_read_the_admin_api_and_change_nothing(both_tokens):
    [dead] = await seed_dead_letters(both_tokens.database_url, "acme", 1)
    viewer = {"Authorization": f"Bearer {VIEWER}"}
    async with running_ingress(both_tokens, load_sources(None)) as client:
        assert (await client.get("/admin/dead-letters", headers=viewer)).status == 200
        assert (await client.get(f"/admin/dead-letters/{dead}", headers=viewer)).status == 200
        for action in ("replay", "discard"):
            refused = await client.post(f"/admin/dead-letters/{dead}/{action}", headers=viewer)
            assert refused.status == 403 and await refused.json() == {"error": "forbidden"}
        listed = await (await client.get("/admin/dead-letters", headers=viewer)).json()
    assert [row["status"] for row in listed] == ["dead"]
    assert (await audit_and_history(both_tokens.database_url, dead))[0] == []


async def test_the_admin_api_and_the_cli_write_the_audit_log_and_a_replay_adds_to_the_history(both_tokens):
    one, two = await seed_dead_letters(both_tokens.database_url, "acme", 2)
    operator = {"Authorization": f"Bearer {OPERATOR}"}
    async with running_ingress(both_tokens, load_sources(None)) as client:
        assert (await client.post(f"/admin/dead-letters/{one}/replay", headers=operator)).status == 200
        assert (await client.post(f"/admin/dead-letters/{one}/replay", headers=operator)).status == 200  # again
    for args in (["dlq", "discard", str(two)], ["dlq", "replay", str(two)]):
        result = await asyncio.to_thread(CliRunner().invoke, main, args)
        assert result.exit_code == 0, result.stderr

    audit, history = await audit_and_history(both_tokens.database_url, one)
    assert [(e["role"], e["name"], e["via"], e["action"], e["dead_letter_ids"]) for e in audit] == [
        ("cli", os_user(), "cli", "replay", [two]),
        ("cli", os_user(), "cli", "discard", [two]),
        ("operator", None, "admin-api", "replay", [one]),
        ("operator", None, "admin-api", "replay", [one]),
    ]
    assert [entry["actor"] for entry in history] == ["operator (admin-api)", "operator (admin-api)"]
    assert history[0]["replayed_at"] < history[1]["replayed_at"]
