"""`make chaos SEED=7`'s archive violations (issue 35, finding 5), with a
real ingress, real worker processes, a real SIGKILL and the real `prune`:
a worker completes an event and is killed before its outcome batch is
written, and `prune` deletes the completion before the archive's sweep
read it. The sweep settles from what Postgres recorded; with the record
gone the row said `queued` for good although the event's effect committed
(`1 effect, archived 1 queued`), and a copy that then ran again settled
the first run a `duplicate` of the second (`2 effects, archived 1
duplicate, 1 processed`). On-call reads the archive to answer "what
happened to this event?": it must say each run `processed`."""

import asyncio

import asyncpg
import pytest
import redis.asyncio as redis
from click.testing import CliRunner

from tests.acceptance.test_archive_outcomes import arrivals_written, post, sources_path  # noqa: F401 - a fixture
from tests.acceptance.test_archive_twin_processes import _hold_archive_writes, _lose_the_batch, _outcome_batch_waiting
from tests.support.ingress import running_ingress
from tests.support.processes import wait_for_output, wait_until
from webhook_ingest.cli.main import main
from webhook_ingest.shared import upkeep as archive_upkeep
from webhook_ingest.shared.archive.store import ArchiveStore
from webhook_ingest.shared.redis_keys import key_prefix
from webhook_ingest.shared.sources.model import load_sources
from webhook_ingest.shared.upkeep import ArchiveUpkeep

pytestmark = pytest.mark.usefixtures("effects_tables")


async def _statuses(connection, key: str) -> list[str]:
    return [
        row["status"]
        for row in await connection.fetch(
            "SELECT status FROM event_archive WHERE key = $1 ORDER BY received_at, arrival", key
        )
    ]


async def _run_then_lose_its_outcome(fleet, connection, blocker, sources_path: str, key: str) -> None:  # noqa: F811
    """A worker runs the queued event to its completion and is SIGKILLed
    while its outcome batch waits for the archive (as a cut Postgres holds
    it back): the completion is durable, the note is lost."""
    held = await _hold_archive_writes(blocker)
    worker = fleet.worker("--concurrency", "8", env={"WEBHOOK_INGEST_SOURCES": sources_path})
    await wait_until(
        lambda: connection.fetchval("SELECT count(*) FROM processed_events WHERE key = $1", key),
        60,
        message="the event completed",
    )
    await wait_until(lambda: _outcome_batch_waiting(connection), 60, message="its outcome batch waiting")
    worker.kill()
    await _lose_the_batch(connection)
    await held.rollback()


async def _prune(connection, key: str) -> None:
    """`webhook-ingest prune --older-than 1s`, once the key's completion is past that window."""
    await wait_until(
        lambda: connection.fetchval(
            "SELECT completed_at < now() - interval '1 second' FROM processed_events WHERE key = $1", key
        ),
        30,
        message="the completion past the window",
    )
    pruned = await asyncio.to_thread(CliRunner().invoke, main, ["prune", "--older-than", "1s"])
    assert pruned.exit_code == 0, pruned.output
    assert not await connection.fetchval("SELECT count(*) FROM processed_events WHERE key = $1", key)


async def _redis_forgets(settings, key: str) -> None:
    client = redis.from_url(settings.redis_urls[0])
    try:
        await client.delete(key_prefix(settings.namespace) + key)
    finally:
        await client.aclose()


async def _sweep(connection, sources_path: str, monkeypatch) -> None:  # noqa: F811
    monkeypatch.setattr(archive_upkeep, "SETTLE_GRACE_SECONDS", 0.0)
    await ArchiveUpkeep(ArchiveStore(connection), load_sources(sources_path)).settle()


async def test_a_run_whose_outcome_was_lost_is_processed_after_a_prune(settings, fleet, sources_path, monkeypatch):  # noqa: F811
    async with running_ingress(settings, load_sources(sources_path)) as client:
        await post(client, "acme", "evt_1")
        await arrivals_written(settings.database_url)
    connection = await asyncpg.connect(settings.database_url)
    blocker = await asyncpg.connect(settings.database_url)
    try:
        await _run_then_lose_its_outcome(fleet, connection, blocker, sources_path, "acme:evt_1")
        assert await _statuses(connection, "acme:evt_1") == ["queued"]  # what the kill left
        await _prune(connection, "acme:evt_1")
        await _sweep(connection, sources_path, monkeypatch)
        assert await _statuses(connection, "acme:evt_1") == ["processed"]
    finally:
        await blocker.close()
        await connection.close()


async def test_a_run_repeated_after_a_prune_is_archived_as_a_second_run(
    settings,
    fleet,
    sources_path,  # noqa: F811
    monkeypatch,
):
    connection = await asyncpg.connect(settings.database_url)
    blocker = await asyncpg.connect(settings.database_url)
    try:
        async with running_ingress(settings, load_sources(sources_path)) as client:
            assert await post(client, "acme", "evt_2") == "accepted"
            await arrivals_written(settings.database_url)
            await _run_then_lose_its_outcome(fleet, connection, blocker, sources_path, "acme:evt_2")
            await _prune(connection, "acme:evt_2")
            # a copy after the window, once Redis forgot the key too (its done TTL, or the chaos run's
            # FLUSHALL): the completion is forgotten, so it runs again (docs/reference.md §2)
            await _redis_forgets(settings, "acme:evt_2")
            assert await post(client, "acme", "evt_2") == "accepted"
            worker = fleet.worker("--concurrency", "8", env={"WEBHOOK_INGEST_SOURCES": sources_path})
            await wait_for_output(worker, "worker_consuming")
            await wait_until(
                lambda: connection.fetchval(
                    "SELECT count(*) FROM event_archive WHERE key = 'acme:evt_2' AND status = 'processed'"
                    " AND body IS NOT NULL"
                    " AND arrival = (SELECT arrival FROM processed_events WHERE key = 'acme:evt_2')"
                ),
                60,
                message="the second run archived",
            )
        await _sweep(connection, sources_path, monkeypatch)
        assert await connection.fetchval("SELECT count(*) FROM effects WHERE key = 'acme:evt_2'") == 2
        assert await _statuses(connection, "acme:evt_2") == ["processed", "processed"]  # two runs, each archived
    finally:
        await blocker.close()
        await connection.close()


async def test_a_copy_prune_settled_that_then_runs_is_archived_as_its_run(
    settings,
    fleet,
    sources_path,  # noqa: F811
    monkeypatch,
):
    """`make chaos SEED=7`'s `2 effects, archived 2 duplicate, 1 processed`:
    the first arrival ran; a copy was still queued (the ingress no longer
    knew the event completed) when `prune` deleted the completion and
    settled the copy a `duplicate` of it. The copy then ran, which the
    prune allows (docs/reference.md §2), and its worker was SIGKILLed
    before its outcome batch. Its own run is its end: `processed`."""
    connection = await asyncpg.connect(settings.database_url)
    blocker = await asyncpg.connect(settings.database_url)
    try:
        async with running_ingress(settings, load_sources(sources_path)) as client:
            assert await post(client, "acme", "evt_3") == "accepted"
            worker = fleet.worker("--concurrency", "8", env={"WEBHOOK_INGEST_SOURCES": sources_path})
            await wait_until(
                lambda: connection.fetchval(
                    "SELECT count(*) FROM event_archive WHERE key = 'acme:evt_3' AND status = 'processed'"
                ),
                60,
                message="the first run archived",
            )
            worker.kill()
            await _redis_forgets(settings, "acme:evt_3")
            assert await post(client, "acme", "evt_3") == "accepted"
            await arrivals_written(settings.database_url)
        await _prune(connection, "acme:evt_3")
        assert await _statuses(connection, "acme:evt_3") == ["processed", "duplicate"]  # the prune's note
        await _run_then_lose_its_outcome(fleet, connection, blocker, sources_path, "acme:evt_3")
        await _sweep(connection, sources_path, monkeypatch)
        assert await connection.fetchval("SELECT count(*) FROM effects WHERE key = 'acme:evt_3'") == 2
        assert await _statuses(connection, "acme:evt_3") == ["processed", "processed"]  # two runs, each archived
    finally:
        await blocker.close()
        await connection.close()
