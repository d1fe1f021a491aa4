"""A runner frozen (a suspended VM, a CLI stopped by Ctrl-Z) longer than a
day while its replay was cancelled: the archive's upkeep pruned the items
it had still to read (docs/design.md, "Replay items pruned": an ended
replay's items go once their events left the archive, a day after its
end). Waking, it found no item left and ended its run `done`: nothing
published and the replay's row untouched (finish_event_replay is the
running runner's only), but its `events_replay` audit entry said `done` of
a replay cancelled a day before. Now it holds its run once more before it
ends `done`, and ends `cancelled`. Real Postgres (attacker review of
2a0ce2d)."""

import json
from datetime import timedelta

import asyncpg
import pytest

from tests.support.archive import archived_event, seed_archive
from tests.support.event_replays import claimed_replay, replay_job
from tests.support.pruning import A_WEEK_ON, SOURCES, YESTERDAY
from webhook_ingest.shared.archive.store import ArchiveStore
from webhook_ingest.shared.audit.actor import Actor
from webhook_ingest.shared.replays.store import EventReplayStore
from webhook_ingest.shared.runs import paced as paced_runs
from webhook_ingest.shared.upkeep import ArchiveUpkeep


@pytest.fixture
async def connection(database):
    connection = await asyncpg.connect(database)
    yield connection
    await connection.close()


def _never_asked():
    raise AssertionError("nothing is published")


async def test_a_runner_that_wakes_after_its_cancelled_replay_was_pruned_ends_cancelled_not_done(database, connection):
    await seed_archive(database, [archived_event("acme", f"old_{n}", YESTERDAY + timedelta(seconds=n)) for n in (1, 2)])
    store = EventReplayStore(connection)
    claimed = await claimed_replay(store, "acme")
    job = replay_job(claimed, store, None, "ns")
    job._channel = _never_asked  # the runner froze before its next page of items
    # Meanwhile: cancelled, two days ago; its events' day dropped; the upkeep pruned its items.
    assert await store.cancel(claimed.id, Actor.cli())
    await connection.execute(
        "UPDATE event_replays SET finished_at = now() - interval '2 days' WHERE id = $1", claimed.id
    )
    await ArchiveStore(connection).keep({"acme": timedelta(days=7)}, now=A_WEEK_ON)
    assert await ArchiveUpkeep(ArchiveStore(connection), SOURCES).prune() == 2

    ended = await paced_runs.run(job)  # it wakes up

    replay = await store.get(claimed.id)
    entry = await connection.fetchval("SELECT detail FROM audit_log WHERE action = 'events_replay'")
    assert (replay.state, replay.published, replay.handled) == ("cancelled", 0, 0)  # untouched
    assert (ended, json.loads(entry)["state"]) == ("cancelled", "cancelled")
