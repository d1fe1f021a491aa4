"""A replay whose runner died mid-publish, taken over: the item it had in
flight is published again by its successor, and the handler still runs once
(docs/design.md, "Paced runs"). Real worker process, real paced
runs; the first copy is run and completed before the second is sent, as a
takeover 30 s later would find it."""

import asyncio
from datetime import timedelta

import asyncpg
import pytest

from tests.support.archive import archived_event, minutes_ago, seed_archive
from tests.support.event_replays import DiesAfterItsFirstPublish, claimed_replay, replay_job
from tests.support.events import queue_depth
from tests.support.exactly_once import effects_by_key, metered_worker, write_sources
from tests.support.ingress import queued_events
from tests.support.processes import count_rows, outcomes, wait_for_output, wait_until
from tests.support.replay_handlers import REPLAY_RUNS_TABLE
from webhook_ingest.cli.dlq import confirm_channel
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.replays.store import EventReplayStore
from webhook_ingest.shared.runs.paced import run

pytestmark = pytest.mark.usefixtures("effects_tables")
KEYS = [f"acme:evt_{n}" for n in (1, 2, 3)]


async def test_the_item_a_dead_runner_had_in_flight_is_published_again_and_runs_once(settings, fleet, tmp_path):
    start = minutes_ago(10)
    await seed_archive(
        settings.database_url,
        [archived_event("acme", key.split(":")[1], start + timedelta(seconds=n)) for n, key in enumerate(KEYS)],
    )
    first, second = await asyncpg.connect(settings.database_url), await asyncpg.connect(settings.database_url)
    try:
        await second.execute(REPLAY_RUNS_TABLE)
        worker, metrics = metered_worker(
            fleet,
            {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", "tests.support.replay_handlers:recorded")},
        )
        await wait_for_output(worker, "worker_consuming")
        dying = DiesAfterItsFirstPublish(first)
        replay = await claimed_replay(dying, "acme")
        async with confirm_channel(settings) as channel:
            assert await run(replay_job(replay, dying, channel, settings.namespace)) == "failed"
            await _until_completed(settings, 1)  # the dead runner's copy ran

            await second.execute(
                "UPDATE event_replays SET stepped_at = now() - interval '1 minute' WHERE id = $1", replay.id
            )  # as 30 s + 2/rate without a step would
            taker = EventReplayStore(second)
            taken = await taker.claim(replay.id, 1000)  # the console's Resume
            assert taken is not None and taken.next_item == 1  # the item in flight was never stepped
            published: list[int] = []
            job = replay_job(
                taken,
                taker,
                channel,
                settings.namespace,
                progress=lambda item, total, count, skipped: published.append(item),
            )
            assert await run(job) == "done"
        await _until_settled(settings, len(KEYS))
        finished = await taker.get(replay.id)
        handled = await outcomes([metrics])
    finally:
        first.terminate()
        await second.close()
    assert published == [1, 2, 3]  # item 1 went out twice: once from each runner
    assert (finished.state, finished.published, finished.handled, finished.in_doubt) == ("done", 3, 3, False)
    assert (handled.get("processed"), handled.get("duplicate")) == (3, 1)  # the second copy reached the worker
    assert await effects_by_key(settings.database_url) == {f"replay-{replay.id}/{key}": 1 for key in KEYS}


async def _until_completed(settings, count: int) -> None:
    async def done() -> bool:
        return await count_rows(settings.database_url, "processed_events") >= count

    await wait_until(done, 30, message=f"{count} completions")


async def _until_settled(settings, count: int) -> None:
    """`count` completions, the events queue empty, and a second more for a copy to be run (or not)."""
    await _until_completed(settings, count)

    async def drained() -> bool:
        return await queue_depth(settings.amqp_url, topology.events_queue(settings.namespace)) == 0

    await wait_until(drained, 30, message="an empty events queue")
    await asyncio.sleep(1.5)


async def test_a_takeover_that_finds_the_item_in_flight_gone_from_the_archive_still_counts_what_went_out(settings):
    start = minutes_ago(10)
    await seed_archive(
        settings.database_url,
        [archived_event("acme", key.split(":")[1], start + timedelta(seconds=n)) for n, key in enumerate(KEYS[:2])],
    )
    first, second = await asyncpg.connect(settings.database_url), await asyncpg.connect(settings.database_url)
    try:
        dying = DiesAfterItsFirstPublish(first)
        replay = await claimed_replay(dying, "acme")
        async with confirm_channel(settings) as channel:
            assert await run(replay_job(replay, dying, channel, settings.namespace)) == "failed"
            await second.execute("DELETE FROM event_archive WHERE key = $1", KEYS[0])  # its day dropped meanwhile
            await second.execute(
                "UPDATE event_replays SET stepped_at = now() - interval '1 minute' WHERE id = $1", replay.id
            )
            taker = EventReplayStore(second)
            taken = await taker.claim(replay.id, 1000)
            assert taken is not None
            assert await run(replay_job(taken, taker, channel, settings.namespace)) == "done"
        finished = await taker.get(replay.id)
    finally:
        first.terminate()
        await second.close()
    queued = await queued_events(settings.amqp_url, settings.namespace)
    assert len(queued) == 2  # the dead runner's item 1, the taker's item 2
    assert (finished.state, finished.published, finished.document()["in_doubt"]) == ("done", len(queued), 1)
