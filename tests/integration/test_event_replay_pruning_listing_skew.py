"""Listing the replays to prune when one replay holds every item left
(attacker review of 15ce0f6). Ended replays whose items are all gone keep
their pass rows, and are listed no more; but `event_replays_to_prune`
probes each ended replay's items with EXISTS (replay_id = r.id ...), and
once the statistics say one replay holds every item left (a big replay
whose items are still archived, behind many small ones pruned empty: the
state pruning leads to), the planner reads each probe as a seq scan of
event_replay_items: 5,120 ended replays and 20,000 items take ~8 s,
100,000 items ~85 s, past the statement's PRUNE_SECONDS (10 s): every
round then timed out and nothing was pruned again. Now the last item
left is read as max(): one backward probe of the primary key each. Real
Postgres."""

from datetime import timedelta

import asyncpg

from tests.support.archive import archived_event, seed_archive
from tests.support.pruning import DAY, MIDNIGHT
from webhook_ingest.shared.archive.search import parse_filter
from webhook_ingest.shared.audit.actor import Actor
from webhook_ingest.shared.replays import store as event_replay_store
from webhook_ingest.shared.replays.store import EventReplayStore


async def test_listing_stays_cheap_when_one_replay_holds_every_item_left(database, monkeypatch):
    monkeypatch.setattr(event_replay_store, "PRUNE_SECONDS", 2.0)
    await seed_archive(database, [archived_event("acme", f"k{n}", MIDNIGHT + timedelta(seconds=n)) for n in range(3)])
    connection = await asyncpg.connect(database)
    try:
        replay = await EventReplayStore(connection).prepare(parse_filter({"source": "acme"}), Actor.cli())
        await connection.execute(
            "UPDATE event_replays SET state = 'done', finished_at = now() - interval '2 days' WHERE id = $1", replay.id
        )
        columns = ", ".join(
            row["column_name"]
            for row in await connection.fetch(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'event_replays'"
                " AND column_name <> 'id'"
            )
        )
        for _ in range(4):
            await connection.execute(f"INSERT INTO event_replays ({columns}) SELECT {columns} FROM event_replays")
        for _ in range(10):  # 5,120 ended replays, their items all gone, each with its pass row over
            await connection.execute(
                f"INSERT INTO event_replays ({columns}) SELECT {columns} FROM event_replays WHERE id <= 1024"
            )
        await connection.execute(
            "INSERT INTO event_replay_prune_passes (replay_id, next_item, pass_started_at)"
            " SELECT id, 20001, now() - interval '2 days' FROM event_replays"
        )
        # the first replay holds every item left, all still archived, its pass over an hour ago
        await connection.execute(
            "INSERT INTO event_replay_items (replay_id, item, source, key, received_at)"
            " SELECT $1, g, 'acme', 'acme:k0', now() FROM generate_series(4, 20000) g",
            replay.id,
        )
        await connection.execute(
            "UPDATE event_replay_prune_passes SET pass_started_at = now() - interval '1 hour' WHERE replay_id = $1",
            replay.id,
        )
        await connection.execute("ANALYZE")
        assert await EventReplayStore(connection).to_prune(DAY, 20, DAY) == []
    finally:
        await connection.close()
