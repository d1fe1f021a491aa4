"""What the CLI prints is safe for the operator's terminal (issue 36,
finding 9): an event id, type or error carrying OSC 52 (a clipboard
write), OSC 0 (the window title), CSI or C1 controls is printed escaped by
`events list|show` and `dlq list|show`, piped or not."""

import asyncio
import dataclasses
import json
from datetime import timedelta

import asyncpg
import orjson
import pytest
from click.testing import CliRunner

from tests.support.dead_letters import failure
from tests.support.events import make_event
from webhook_ingest.cli.main import main
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.archive.store import ArchiveStore
from webhook_ingest.shared.dead_letters.model import record_dead_letter
from webhook_ingest.shared.settings import Settings

CLIPBOARD, TITLE, CLEAR, C1_CSI = "\x1b]52;c;Y3VybCBldmlsLnNo\x07", "\x1b]0;owned\x1b\\", "\x1b[2J", "\x9b31m"
EVENT_ID = f"evt_{CLIPBOARD}{C1_CSI}"
EVENT_TYPE = f"invoice.{TITLE}"
ERROR = f"RuntimeError: {CLEAR}downstream\rsaid no"
CONTROLS = ("\x1b", "\x07", "\x9b", "\r")


@pytest.fixture
def admin_settings(settings, monkeypatch) -> Settings:
    monkeypatch.setenv("WEBHOOK_INGEST_ADMIN_TOKEN", "admin-token-of-the-terminal-tests")
    return Settings()


@pytest.fixture
async def hostile(admin_settings):
    made = make_event("stripe", EVENT_ID, {"type": EVENT_TYPE})
    event = dataclasses.replace(made, body=orjson.dumps({"id": EVENT_ID, "type": EVENT_TYPE}))
    connection = await asyncpg.connect(admin_settings.database_url)
    try:
        store = ArchiveStore(connection)
        await store.keep({"stripe": timedelta(days=7)})
        await store.write_arrivals([archive.arrival_row(event, EVENT_TYPE, '{"x-test": "1"}', archive.QUEUED)])
        await store.write_outcomes([archive.outcome_row(event, archive.DEAD, event.received_at, ERROR)])
        await record_dead_letter(connection, event, [{**failure(1), "message": ERROR}])
    finally:
        await connection.close()
    return event


async def cli(*args: str) -> str:
    """The command's output as a pipe gets it (in a thread: the command runs its own event loop)."""
    result = await asyncio.to_thread(CliRunner().invoke, main, list(args))
    assert result.exit_code == 0, result.output
    return result.output


async def test_no_control_sequence_reaches_the_terminal(hostile):
    dead_letter_id = json.loads(await cli("dlq", "list", "--json"))[0]["id"]
    outputs = {
        "events list": await cli("events", "list"),
        "events show": await cli("events", "show", hostile.key),
        "dlq list": await cli("dlq", "list"),
        "dlq show": await cli("dlq", "show", str(dead_letter_id)),
        "events list --json": await cli("events", "list", "--json"),
    }
    for command, output in outputs.items():
        assert not any(control in output for control in CONTROLS), (command, output)
    assert "\\u001b]52;c;" in outputs["events list"]  # escaped, not dropped: the operator sees what was sent
    assert json.loads(outputs["events list --json"])["events"][0]["event_id"] == EVENT_ID  # JSON still exact
