"""1c1a6ff's interleaving with real worker processes and real SIGKILLs: a
twin message of one arrival (the outbox's row beside a publish confirmed
late) finds the arrival's attempt 1 handed on, after the chain's own
'retrying' note died with its worker; the run that follows completes and
its worker is killed before its outcome batch. The twin's note must not
hide the run, and the archive's upkeep must say the arrival ran."""

import dataclasses
import time
from datetime import timedelta

import asyncpg
import pytest

from tests.support.events import make_event, publish_events
from tests.support.processes import wait_until
from webhook_ingest.shared import upkeep as archive_upkeep
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.archive.store import ArchiveStore
from webhook_ingest.shared.event.message import new_arrival
from webhook_ingest.shared.sources.model import load_sources
from webhook_ingest.shared.upkeep import ArchiveUpkeep

pytestmark = pytest.mark.usefixtures("effects_tables")

SOURCES = """[sources.flaky]
scheme = "hmac-sha256"
secrets = ["twin-secret"]
handler = "tests.support.handlers:inbox_failing_odd_ids_once"
retry_delays = [8]
"""


async def _one(connection, query: str, *args):
    return await connection.fetchval(query, *args)


async def _hold_archive_writes(blocker):
    """The archive's writes wait (as a cut Postgres holds them back) until the returned transaction ends."""
    held = blocker.transaction()
    await held.start()
    await blocker.execute("LOCK TABLE event_archive IN EXCLUSIVE MODE")
    return held


async def _lose_the_batch(connection) -> None:
    """The killed worker's statement, still waiting, never runs: Postgres
    would otherwise run it once the lock is free (it does not notice its
    client is gone until it answers), which a worker killed before sending it
    does not get."""
    assert (
        await connection.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO event_archive%'"
        )
        == 1
    )


async def _no_outcome_batch_waiting(connection) -> bool:
    return not await _outcome_batch_waiting(connection)


async def _outcome_batch_waiting(connection) -> bool:
    return bool(
        await connection.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            " AND query LIKE '%INSERT INTO event_archive%'"
        )
    )


async def test_a_twin_of_a_handed_on_attempt_and_two_kills_still_archive_the_run(
    settings, fleet, tmp_path, monkeypatch
):
    sources_path = tmp_path / "sources.toml"
    sources_path.write_text(SOURCES)
    env = {"WEBHOOK_INGEST_SOURCES": str(sources_path)}
    event = make_event("flaky", "evt_1")  # odd: its first attempt fails
    event = dataclasses.replace(event, arrival=new_arrival(), received_at=round(time.time() * 1000) / 1000)
    connection = await asyncpg.connect(settings.database_url)
    blocker = await asyncpg.connect(settings.database_url)
    store = ArchiveStore(connection)
    try:
        await store.keep({"flaky": timedelta(days=7)})
        await store.write_arrivals([archive.arrival_row(event, "test.event", "{}", archive.QUEUED)])

        held = await _hold_archive_writes(blocker)
        first = fleet.worker("--concurrency", "8", env=env)
        await publish_events(settings.amqp_url, settings.namespace, [event])
        await wait_until(
            lambda: _one(connection, "SELECT attempt FROM key_fences WHERE key = $1", event.key),
            60,
            message="attempt 1 handed on",
        )
        await wait_until(lambda: _outcome_batch_waiting(connection), 60, message="its 'retrying' note waiting")
        assert await _one(connection, "SELECT arrival FROM key_fences WHERE key = $1", event.key) == event.arrival
        first.kill()
        await _lose_the_batch(connection)
        await held.rollback()
        assert await _one(connection, "SELECT status FROM event_archive WHERE key = $1", event.key) == "queued"

        held = await _hold_archive_writes(blocker)
        await publish_events(settings.amqp_url, settings.namespace, [event])  # the twin: same arrival, attempt 1
        second = fleet.worker("--concurrency", "8", env=env)
        await wait_until(lambda: _outcome_batch_waiting(connection), 30, message="the twin's note waiting")
        await held.rollback()
        await wait_until(lambda: _no_outcome_batch_waiting(connection), 30, message="the twin's note written")
        # acked as a copy of its own arrival's attempt: the arrival's end is its chain's, not 'duplicate'
        assert await _one(connection, "SELECT status FROM event_archive WHERE key = $1", event.key) == "queued"
        held = await _hold_archive_writes(blocker)
        await wait_until(
            lambda: _one(connection, "SELECT count(*) FROM processed_events WHERE key = $1", event.key),
            60,
            message="attempt 2 completed",
        )
        await wait_until(lambda: _outcome_batch_waiting(connection), 60, message="its 'processed' note waiting")
        second.kill()
        await _lose_the_batch(connection)
        await held.rollback()
        assert await _one(connection, "SELECT status FROM event_archive WHERE key = $1", event.key) == "queued"
        assert await _one(connection, "SELECT arrival FROM processed_events WHERE key = $1", event.key) == event.arrival

        monkeypatch.setattr(archive_upkeep, "SETTLE_GRACE_SECONDS", 0.0)
        await ArchiveUpkeep(store, load_sources(str(sources_path))).settle()
        row = await connection.fetchrow("SELECT status, attempts FROM event_archive WHERE key = $1", event.key)
        assert tuple(row.values()) == ("processed", 2)
    finally:
        await blocker.close()
        await connection.close()
