"""`webhook-ingest events export` (issue 22, item 6): the archive's selection
as JSON lines, the filters of `events list`, bodies that are not JSON
exactly, a large selection streamed page by page, a reader that stops
reading. Real Postgres; the archive written as the ingress and the workers
write it (ArchiveStore)."""

import asyncio
import base64
import dataclasses
import functools
import json
import operator
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from click.testing import CliRunner

from tests.support.events import make_event
from webhook_ingest.cli.main import main
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.archive.search import EventFilter
from webhook_ingest.shared.archive.store import ArchiveStore

CLI = os.path.join(os.path.dirname(sys.executable), "webhook-ingest")
NOW = datetime.now(UTC).replace(microsecond=0)
FORM = b"a=1&b=%FF"
NOT_UTF8 = b"\xff\xfe\x00binary"


def event(source: str, event_id: str, minutes_ago: float, kind: str, body: bytes | None = None, **payload):
    made = make_event(source, event_id, {"type": kind})
    body = body if body is not None else json.dumps({"id": event_id, "type": kind, **payload}).encode()
    return dataclasses.replace(made, body=body, received_at=(NOW - timedelta(minutes=minutes_ago)).timestamp())


async def archived(settings, events, outcomes=()) -> None:
    connection = await asyncpg.connect(settings.database_url)
    try:
        store = ArchiveStore(connection)
        await store.keep({source: timedelta(days=7) for source in {e.source for e in events}})
        await store.write_arrivals(
            [archive.arrival_row(e, e.event_id.split("_")[0], '{"x-test": "1"}', archive.QUEUED) for e in events]
        )
        await store.write_outcomes(list(outcomes))
    finally:
        await connection.close()


def export(*args: str) -> list[dict]:
    result = CliRunner().invoke(main, ["events", "export", *args])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in result.stdout.splitlines()]


async def test_the_filters_of_events_list_select_what_is_exported(settings):
    paid = event("stripe", "inv_1", 50, "invoice.paid", customer="cus_123", amount=10**30)
    other = event("stripe", "inv_2", 40, "invoice.paid", customer="cus_456")
    push = event("github", "push_1", 30, "push", ref="main")
    at = NOW.timestamp()
    await archived(
        settings,
        [paid, other, push],
        [
            archive.outcome_row(paid, archive.PROCESSED, at),
            archive.outcome_row(other, archive.DEAD, at, "RuntimeError: 500"),
        ],
    )

    everything = await asyncio.to_thread(export)
    assert [row["key"] for row in everything] == [push.key, other.key, paid.key]  # newest first, like `list`
    first = everything[2]
    assert first["payload"] == {"id": "inv_1", "type": "invoice.paid", "customer": "cus_123", "amount": 10**30}
    assert (first["status"], first["body_base64"], first["headers"]) == ("processed", None, {"x-test": "1"})
    assert first["payload_sha256"] == paid.payload_sha256

    assert [row["key"] for row in await asyncio.to_thread(export, "--payload", '{"customer": "cus_123"}')] == [paid.key]
    assert [row["key"] for row in await asyncio.to_thread(export, "--status", "dead")] == [other.key]
    assert [row["last_error"] for row in await asyncio.to_thread(export, "--status", "dead")] == ["RuntimeError: 500"]
    assert [row["key"] for row in await asyncio.to_thread(export, "--source", "github")] == [push.key]
    assert [row["key"] for row in await asyncio.to_thread(export, "--type", "inv")] == [other.key, paid.key]
    window = (
        "--since",
        (NOW - timedelta(minutes=45)).isoformat(),
        "--until",
        (NOW - timedelta(minutes=35)).isoformat(),
    )
    assert [row["key"] for row in await asyncio.to_thread(export, *window)] == [other.key]
    assert [row["key"] for row in await asyncio.to_thread(export, "--key", "stripe:inv_1")] == [paid.key]
    assert await asyncio.to_thread(export, "--event-id", "nothing") == []


async def test_a_body_that_is_not_json_is_exported_exactly_in_base64(settings, tmp_path):
    form = event("forms", "form_1", 20, "form", body=FORM)
    raw = event("forms", "raw_1", 10, "raw", body=NOT_UTF8)
    await archived(settings, [form, raw])
    target = tmp_path / "export.jsonl"
    result = await asyncio.to_thread(CliRunner().invoke, main, ["events", "export", "--output", str(target)])
    assert (result.exit_code, result.stdout) == (0, "")
    rows = {row["event_id"]: row for row in map(json.loads, target.read_text().splitlines())}
    assert base64.b64decode(rows["form_1"]["body_base64"]) == FORM and rows["form_1"]["payload"] is None
    assert base64.b64decode(rows["raw_1"]["body_base64"]) == NOT_UTF8 and rows["raw_1"]["payload"] is None


async def test_a_large_selection_streams_page_by_page_and_ends_quietly_on_a_closed_pipe(settings):
    many = [event("bulk", f"bulk_{n:05d}", n / 100, "bulk", customer=f"cus_{n % 7}") for n in range(1_205)]
    await archived(settings, many)
    connection = await asyncpg.connect(settings.database_url)
    try:
        pages = [[row["key"] for row in rows] async for rows in ArchiveStore(connection).export(EventFilter(), 500)]
    finally:
        await connection.close()
    assert [len(page) for page in pages] == [500, 500, 205]  # never more than a page in memory
    assert functools.reduce(operator.iadd, pages, []) == [
        e.key for e in many
    ]  # newest first, each once, across the pages' edges

    assert len(await asyncio.to_thread(export, "--source", "bulk")) == 1_205
    head = await asyncio.to_thread(
        subprocess.run,
        f"{CLI} events export --source bulk | head -n 3",
        shell=True,
        capture_output=True,
        env=os.environ,
        timeout=60,
    )
    assert [json.loads(line)["key"] for line in head.stdout.splitlines()] == [e.key for e in many[:3]]
    assert head.stderr == b""  # no traceback from the closed pipe


@pytest.mark.parametrize(
    "args, message", [(("--since", "yesterday"), "invalid --since"), (("--payload", "[1]"), "invalid --payload")]
)
def test_a_filter_that_cannot_be_one_is_one_line(settings, args, message):
    result = CliRunner().invoke(main, ["events", "export", *args])
    assert result.exit_code == 2 and message in result.output
