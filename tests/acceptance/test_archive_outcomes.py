"""Every accepted event is in the archive with what became of it (issue 22,
item 1): processed, retried then processed, retried then dead, dead at
once, discarded after its dead letter was discarded, a conflict, a copy.
The real ingress app and a real worker process; the archive is read once
the workers settled everything (no timing threshold)."""

import time
from types import SimpleNamespace

import asyncpg
import orjson
import pytest

from tests.support.ingress import running_ingress
from tests.support.processes import wait_for_output, wait_until
from webhook_ingest.ingress.intake import webhooks
from webhook_ingest.shared import signatures
from webhook_ingest.shared import upkeep as archive_upkeep
from webhook_ingest.shared.archive.store import ArchiveStore
from webhook_ingest.shared.dead_letters.store import DeadLetterStore
from webhook_ingest.shared.sources.model import load_sources
from webhook_ingest.shared.upkeep import ArchiveUpkeep

pytestmark = pytest.mark.usefixtures("effects_tables")

SECRET = "archive-secret"
SOURCES = {  # source: its handler and settings
    "acme": 'handler = "tests.support.handlers:counted_inbox"',
    "flaky": 'handler = "tests.support.handlers:inbox_failing_odd_ids_once"\nretry_delays = [0.2]',
    "doomed": 'handler = "tests.support.handlers:always_fails"\nmax_attempts = 2\nretry_delays = [0.2]',
    "refused": 'handler = "tests.support.handlers:permanently_fails"',
}


@pytest.fixture
def sources_path(tmp_path) -> str:
    path = tmp_path / "sources.toml"
    path.write_text(
        "\n".join(
            f'[sources.{name}]\nscheme = "hmac-sha256"\nsecrets = ["{SECRET}"]\n{settings}\n'
            for name, settings in SOURCES.items()
        )
    )
    return str(path)


async def post(client, source: str, event_id: str, **payload) -> str:
    body = orjson.dumps({"id": event_id, "type": "test.event", **payload})
    response = await client.post(f"/webhooks/{source}", data=body, headers=signatures.sign("hmac-sha256", body, SECRET))
    assert response.status == 200, await response.text()
    return (await response.json())["status"]


async def archive_of(database_url: str) -> list[tuple]:
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(
            "SELECT key, status, attempts, last_error, completed_at IS NOT NULL AS completed,"
            " body IS NOT NULL AS has_body FROM event_archive ORDER BY key, received_at"
        )
    finally:
        await connection.close()
    return [tuple(row.values()) for row in rows]


async def until_settled(database_url: str, expected: int) -> list[tuple]:
    async def settled():
        rows = await archive_of(database_url)
        done = [row for row in rows if row[1] not in ("queued", "retrying")]
        return rows if len(done) == expected and len(rows) == expected else None

    return await wait_until(settled, 60, message=f"{expected} archived events settled")


async def test_every_accepted_event_is_archived_with_what_became_of_it(settings, fleet, sources_path, monkeypatch):
    worker = fleet.worker("--concurrency", "8", env={"WEBHOOK_INGEST_SOURCES": sources_path})
    await wait_for_output(worker, "worker_consuming")
    async with running_ingress(settings, load_sources(sources_path)) as client:
        assert await post(client, "acme", "evt_1") == "accepted"
        assert await post(client, "flaky", "evt_1") == "accepted"  # odd: its first attempt fails
        assert await post(client, "doomed", "evt_2") == "accepted"
        assert await post(client, "refused", "evt_3") == "accepted"
        await until_settled(settings.database_url, 4)
        assert await post(client, "acme", "evt_1") == "duplicate"  # a copy, once the event completed
        assert await post(client, "acme", "evt_1", amount=2) == "accepted"  # the same key, another payload
        rows = await until_settled(settings.database_url, 6)

    assert rows == [
        ("acme:evt_1", "processed", 1, None, True, True),
        ("acme:evt_1", "duplicate", 0, None, False, True),  # answered by the ingress
        ("acme:evt_1", "conflict", 1, None, False, True),
        ("doomed:evt_2", "dead", 2, "RuntimeError: boom on attempt 2", False, True),
        ("flaky:evt_1", "processed", 2, "RuntimeError: odd event, first attempt", True, True),
        ("refused:evt_3", "dead", 1, "PermanentError: this event can never succeed", False, True),
    ]


async def test_an_event_whose_dead_letter_is_discarded_is_archived_discarded(settings, fleet, sources_path):
    worker = fleet.worker("--concurrency", "8", env={"WEBHOOK_INGEST_SOURCES": sources_path})
    await wait_for_output(worker, "worker_consuming")
    async with running_ingress(settings, load_sources(sources_path)) as client:
        await post(client, "refused", "evt_3")
        await until_settled(settings.database_url, 1)
    connection = await asyncpg.connect(settings.database_url)
    try:
        [dead_letter_id] = [row["id"] for row in await connection.fetch("SELECT id FROM dead_letters")]
        await DeadLetterStore(connection).discard([dead_letter_id])
        status = await connection.fetchval("SELECT status FROM event_archive WHERE key = 'refused:evt_3'")
    finally:
        await connection.close()
    assert status == "discarded"


async def test_a_copy_that_reaches_a_worker_is_archived_as_a_duplicate(settings, fleet, sources_path):
    """Copies posted one after the other before any worker runs: each is an
    arrival the ingress accepted, and the one that did not run is the copy."""
    async with running_ingress(settings, load_sources(sources_path)) as client:
        assert [await post(client, "acme", "evt_9") for _ in range(3)] == ["accepted"] * 3
        worker = fleet.worker("--concurrency", "8", env={"WEBHOOK_INGEST_SOURCES": sources_path})
        await wait_for_output(worker, "worker_consuming")
        rows = await until_settled(settings.database_url, 3)
    assert sorted(row[1] for row in rows) == ["duplicate", "duplicate", "processed"]


async def until_quiet(database_url: str) -> list[tuple]:
    """The archive once it has rows, none unsettled and each with its body (however many)."""

    async def quiet():
        rows = await archive_of(database_url)
        return rows if rows and all(row[1] not in ("queued", "retrying") and row[5] for row in rows) else None

    return await wait_until(quiet, 60, message="the archived rows settled")


async def test_copies_received_in_the_same_millisecond_are_two_arrivals(settings, fleet, sources_path, monkeypatch):
    """Two copies the ingress stamps with one millisecond (sent together, as
    the chaos run's are), each answered 200: two archived arrivals, the one
    that ran and its copy, each with its body."""
    frozen = time.time()
    monkeypatch.setattr(webhooks, "time", SimpleNamespace(time=lambda: frozen, perf_counter=time.perf_counter))
    async with running_ingress(settings, load_sources(sources_path)) as client:
        assert [await post(client, "acme", "evt_5") for _ in range(2)] == ["accepted"] * 2
        worker = fleet.worker("--concurrency", "8", env={"WEBHOOK_INGEST_SOURCES": sources_path})
        await wait_for_output(worker, "worker_consuming")
        rows = await until_quiet(settings.database_url)
    assert sorted(row[:2] for row in rows) == [("acme:evt_5", "duplicate"), ("acme:evt_5", "processed")]


async def _archived_status(connection, key: str) -> str | None:
    return await connection.fetchval("SELECT status FROM event_archive WHERE key = $1", key)


async def test_a_worker_killed_before_its_outcomes_are_written_leaves_nothing_queued(
    settings, fleet, sources_path, monkeypatch
):
    """The chaos run's 'left queued': the worker completes the event, its
    outcome batch waits for the archive (here: a lock on the table, as a cut
    Postgres would hold it back), and it is SIGKILLed. The completion is
    durable; the archive's upkeep brings the row up to date from it."""
    async with running_ingress(settings, load_sources(sources_path)) as client:
        await post(client, "acme", "evt_7")
        await arrivals_written(settings.database_url)
    connection = await asyncpg.connect(settings.database_url)
    blocker = await asyncpg.connect(settings.database_url)
    try:
        held = blocker.transaction()
        await held.start()
        await blocker.execute("LOCK TABLE event_archive IN EXCLUSIVE MODE")  # the archive's writes wait
        worker = fleet.worker("--concurrency", "8", env={"WEBHOOK_INGEST_SOURCES": sources_path})
        await wait_until(
            lambda: connection.fetchval("SELECT count(*) FROM processed_events WHERE key = 'acme:evt_7'"),
            60,
            message="the event completed",
        )
        await wait_until(
            lambda: connection.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
                " AND query LIKE '%INSERT INTO event_archive%'"
            ),
            60,
            message="the worker's outcome batch waiting",
        )
        worker.kill()
        await held.rollback()
        assert await _archived_status(connection, "acme:evt_7") == "queued"  # what the crash left

        monkeypatch.setattr(archive_upkeep, "SETTLE_GRACE_SECONDS", 0.0)
        await ArchiveUpkeep(ArchiveStore(connection), load_sources(sources_path)).settle()
        assert await _archived_status(connection, "acme:evt_7") == "processed"
    finally:
        await blocker.close()
        await connection.close()


async def arrivals_written(database_url: str) -> list[tuple]:
    """The archive once each row has its body (the ingress's write is in)."""

    async def written():
        rows = await archive_of(database_url)
        return rows if rows and all(row[5] for row in rows) else None

    return await wait_until(written, 30, message="the arrivals written")
