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

import asyncpg

from tests.support.archive import archived_event, minutes_ago, seed_archive
from tests.support.ingress import queued_events
from webhook_ingest.dlq import confirm_channel
from webhook_ingest.shared import run_locks
from webhook_ingest.shared.archived_events import parse_filter
from webhook_ingest.shared.dead_letters import Actor
from webhook_ingest.shared.event_replay_store import EventReplayJob, EventReplayStore
from webhook_ingest.shared.paced_runs import run

HOLD_SECONDS = 1.0  # the server's limit on the runner's held session, short for a fast test


class _SlowArrivalRead(EventReplayStore):
    """The ingress's store whose read of an item's arrival is slow (a retention
    drop or a migration holds the archive's day; the pool's connections are
    all busy): its publish waits for `answered` before it reads and publishes."""

    def __init__(self, database):
        super().__init__(database)
        self.reading, self.answered = asyncio.Event(), asyncio.Event()

    async def publish(self, channel, namespace, replay_id, item, held=None):
        self.reading.set()
        await self.answered.wait()
        return await super().publish(channel, namespace, replay_id, item, held)


async def test_nothing_is_published_after_a_cancel_behind_a_runner_whose_arrival_read_outlasts_its_hold(
        settings, monkeypatch):
    monkeypatch.setattr(run_locks, "HOLD_SECONDS", HOLD_SECONDS)
    await seed_archive(settings.database_url, [archived_event("stripe", "evt_1", minutes_ago(10), "invoice.paid")])
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)  # as the ingress's
    try:
        store = _SlowArrivalRead(pool)
        replay = await store.prepare(parse_filter({"source": "stripe"}), Actor.cli())
        claimed = await store.claim(replay.id, 1000)
        assert claimed is not None
        async with confirm_channel(settings) as channel:
            runner = asyncio.create_task(run(EventReplayJob(claimed, Actor.cli(), store, lambda: channel,
                                                            settings.namespace)))
            await asyncio.wait_for(store.reading.wait(), 10)  # item 1 marked in flight, its read slow
            assert await store.cancel(replay.id)  # returns once the runner's held session is ended
            cancelled = await store.get(replay.id)
            queued_when_cancelled = await queued_events(settings.amqp_url, settings.namespace)
            store.answered.set()
            await asyncio.wait_for(runner, 15)
        queued_after = await queued_events(settings.amqp_url, settings.namespace)
    finally:
        await pool.close()
    assert cancelled is not None
    assert (cancelled.state, cancelled.published, cancelled.in_doubt) == ("cancelled", 1, 1)  # an upper bound
    assert queued_when_cancelled == []
    assert [event.key for event in queued_after] == []  # nothing published after the Cancel returned


async def test_a_run_whose_held_session_the_server_ended_fails_naming_that(settings, monkeypatch):
    monkeypatch.setattr(run_locks, "HOLD_SECONDS", HOLD_SECONDS)
    await seed_archive(settings.database_url, [archived_event("stripe", "evt_1", minutes_ago(10), "invoice.paid")])
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)  # as the ingress's
    try:
        store = _SlowArrivalRead(pool)
        replay = await store.prepare(parse_filter({"source": "stripe"}), Actor.cli())
        claimed = await store.claim(replay.id, 1000)
        assert claimed is not None
        async with confirm_channel(settings) as channel:
            runner = asyncio.create_task(run(EventReplayJob(claimed, Actor.cli(), store, lambda: channel,
                                                            settings.namespace)))
            await asyncio.wait_for(store.reading.wait(), 10)
            await asyncio.sleep(HOLD_SECONDS * 2)  # past the hold: the server ends the held session
            store.answered.set()
            assert await asyncio.wait_for(runner, 15) == "failed"
        failed = await store.get(replay.id)
    finally:
        await pool.close()
    assert failed is not None and failed.error is not None
    assert failed.error.startswith("SessionLost: the run's Postgres session ended mid-item"), failed.error
