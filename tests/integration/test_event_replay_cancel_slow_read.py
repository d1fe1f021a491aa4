"""A Cancel behind an ingress runner whose item outlasts its hold of the run
(docs/reference.md §8, the cancel route: "nothing is [published] after it
returns"). The runner's held session sits idle in its transaction while the
item is acted on: past run_locks.HOLD_SECONDS the server ends it, its lock
goes, and a Cancel waiting for it returns. The item's archived arrival is
read on that held session, so a runner whose read came after that fails it
and publishes nothing (read on another pooled connection, as before, it was
answered and published after the Cancel returned). Real Postgres and
RabbitMQ; the slow read is a wait before it (a retention drop or a migration
holding the day, a busy pool)."""

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg

from tests.support.archive import archived_event, minutes_ago, seed_archive
from tests.support.event_replays import SlowArrivalRead, claimed_replay, replay_job
from tests.support.ingress import queued_events
from webhook_ingest.cli.dlq import confirm_channel
from webhook_ingest.shared.runs import locks as run_locks
from webhook_ingest.shared.runs.paced import run

HOLD_SECONDS = 1.0  # the server's limit on the runner's held session, short for a fast test


@contextlib.asynccontextmanager
async def _a_runner_reading_slowly(settings, monkeypatch) -> AsyncIterator[tuple[SlowArrivalRead, int, asyncio.Task]]:
    """A runner of a replay of one archived event, on a pool as the
    ingress's, once it has marked item 1 in flight and waits on its slow
    read: its store, the replay's id, the runner's task."""
    monkeypatch.setattr(run_locks, "HOLD_SECONDS", HOLD_SECONDS)
    await seed_archive(settings.database_url, [archived_event("stripe", "evt_1", minutes_ago(10), "invoice.paid")])
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)  # as the ingress's
    try:
        store = SlowArrivalRead(pool)
        claimed = await claimed_replay(store, "stripe")
        async with confirm_channel(settings) as channel:
            runner = asyncio.create_task(run(replay_job(claimed, store, channel, settings.namespace)))
            await asyncio.wait_for(store.reading.wait(), 10)  # item 1 marked in flight, its read slow
            yield store, claimed.id, runner
    finally:
        await pool.close()


async def test_nothing_is_published_after_a_cancel_behind_a_runner_whose_arrival_read_outlasts_its_hold(
    settings, monkeypatch
):
    async with _a_runner_reading_slowly(settings, monkeypatch) as (store, replay_id, runner):
        assert await store.cancel(replay_id)  # returns once the runner's held session is ended
        cancelled = await store.get(replay_id)
        queued_when_cancelled = await queued_events(settings.amqp_url, settings.namespace)
        store.answered.set()
        await asyncio.wait_for(runner, 15)
    queued_after = await queued_events(settings.amqp_url, settings.namespace)
    assert cancelled is not None
    assert (cancelled.state, cancelled.published, cancelled.in_doubt) == ("cancelled", 1, 1)  # an upper bound
    assert queued_when_cancelled == []
    assert [event.key for event in queued_after] == []  # nothing published after the Cancel returned


async def test_a_run_whose_held_session_the_server_ended_fails_naming_that(settings, monkeypatch):
    async with _a_runner_reading_slowly(settings, monkeypatch) as (store, replay_id, runner):
        await asyncio.sleep(HOLD_SECONDS * 2)  # past the hold: the server ends the held session
        store.answered.set()
        assert await asyncio.wait_for(runner, 15) == "failed"
        failed = await store.get(replay_id)
    assert failed is not None and failed.error is not None
    assert failed.error.startswith("SessionLost: the run's Postgres session ended mid-item"), failed.error
