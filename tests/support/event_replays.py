"""Paced replays of archived events in a test: one prepared and claimed, the
job that runs it, and the stores whose publish provokes a fault (a runner
that dies after publishing, a read of the item's arrival that is slow)."""

import asyncio

from webhook_ingest.shared.archive.search import parse_filter
from webhook_ingest.shared.audit.actor import Actor
from webhook_ingest.shared.replays.store import EventReplay, EventReplayJob, EventReplayStore


async def claimed_replay(store: EventReplayStore, source: str) -> EventReplay:
    """A replay of `source`'s archived events, prepared and claimed by the
    caller at 1,000 a second (a test does not wait on the pace)."""
    replay = await store.prepare(parse_filter({"source": source}), Actor.cli())
    claimed = await store.claim(replay.id, 1000)
    assert claimed is not None
    return claimed


def replay_job(
    claimed: EventReplay, store: EventReplayStore, channel, namespace: str, progress=None, sources=None
) -> EventReplayJob:
    """The job `paced_runs.run` drives for `claimed`, publishing on `channel` (`sources`: the sources file's)."""
    return EventReplayJob(claimed, Actor.cli(), store, lambda: channel, namespace, progress=progress, sources=sources)


class DiesAfterItsFirstPublish(EventReplayStore):
    """The store of a runner whose process dies (SIGKILL; or Postgres cut
    from it) once its first publish was confirmed, before its step commits:
    its session ends, its step's transaction and its hold of the run with it.
    Its store's database is one connection."""

    async def publish(self, channel, namespace, replay_id, item, held=None, sources=None, woken=None):
        published = await super().publish(channel, namespace, replay_id, item, held, sources, woken)
        self._database.terminate()
        return published


class SlowArrivalRead(EventReplayStore):
    """The store whose read of an item's arrival is slow (a retention drop or
    a migration holds the archive's day; the pool's connections are all
    busy): its publish sets `reading`, then waits for `answered` before it
    reads and publishes."""

    def __init__(self, database):
        super().__init__(database)
        self.reading, self.answered = asyncio.Event(), asyncio.Event()

    async def publish(self, channel, namespace, replay_id, item, held=None, sources=None, woken=None):
        self.reading.set()
        await self.answered.wait()
        return await super().publish(channel, namespace, replay_id, item, held, sources, woken)
