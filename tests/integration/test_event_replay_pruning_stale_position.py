"""A pruning statement of a pass that is over moves the position of the
next pass (attacker review of 15ce0f6). Each statement reads the pass row
in its snapshot and, at its end, moves the position with greatest(); a
statement that read the last pass's position (items left past it in its
snapshot) and whose upsert lands after another upkeep began the next pass
pushes that new pass's position to the old one, past items the new pass
has not read: those whose events left the archive stay a day more (the
pass is then over, begun just now). Real Postgres; each statement is held
at its upsert by a test trigger (a BEFORE INSERT trigger fires before the
conflict check, so the held statement holds no lock on the pass row)."""

import asyncio
from datetime import timedelta

import asyncpg

from tests.support.archive import archived_event, seed_archive
from tests.support.pruning import A_WEEK_ON, DAY, MIDNIGHT, SOURCES, TOMORROW, YESTERDAY
from webhook_ingest.shared.archive.search import parse_filter
from webhook_ingest.shared.archive.store import ArchiveStore
from webhook_ingest.shared.audit.actor import Actor
from webhook_ingest.shared.replays.store import EventReplayStore
from webhook_ingest.shared.upkeep import ArchiveUpkeep

HOLD = """
CREATE FUNCTION test_hold_pass_upsert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('test.hold', true), '') <> '' THEN
        PERFORM pg_advisory_xact_lock(current_setting('test.hold')::bigint);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_hold_pass_upsert BEFORE INSERT ON event_replay_prune_passes
    FOR EACH ROW EXECUTE FUNCTION test_hold_pass_upsert();
"""


async def held(connection, pid: int) -> None:
    """Until the backend `pid` waits on an advisory lock."""
    for _ in range(500):
        if await connection.fetchval(
            "SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND NOT granted)", pid
        ):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"backend {pid} never reached its upsert")


async def test_a_statement_of_the_last_pass_does_not_move_the_next_pass_s_position(database):
    # heartbeat recurs (archived on every day); old_1..old_4 yesterday only: gone once yesterday goes
    await seed_archive(
        database,
        [archived_event("acme", "heartbeat", YESTERDAY)]
        + [archived_event("acme", f"old_{n}", YESTERDAY + timedelta(seconds=n)) for n in range(1, 5)]
        + [archived_event("acme", "heartbeat", MIDNIGHT), archived_event("acme", "heartbeat", TOMORROW)],
    )
    connection = await asyncpg.connect(database)
    x, b, a = [await asyncpg.connect(database) for _ in range(3)]
    try:
        replay = await EventReplayStore(connection).prepare(parse_filter({"source": "acme"}), Actor.cli())
        assert replay.total == 5
        await connection.execute(
            "UPDATE event_replays SET state = 'done', next_item = 6, published = 5,"
            " finished_at = now() - interval '2 days' WHERE id = $1",
            replay.id,
        )
        await ArchiveStore(connection).keep({"acme": timedelta(days=7)}, now=A_WEEK_ON)
        # a pass begun two days ago, at item 4 (it read items 1-3 while old_1 and old_2 were still archived)
        await connection.execute(
            "INSERT INTO event_replay_prune_passes (replay_id, next_item, pass_started_at)"
            " VALUES ($1, 4, now() - interval '2 days')",
            replay.id,
        )
        await connection.execute(HOLD)
        await connection.execute("SELECT pg_advisory_lock(1), pg_advisory_lock(2)")
        await x.execute("SET test.hold = '1'")
        await b.execute("SET test.hold = '2'")

        # X reads items 4 and 5 (gone: deleted) and is held at its upsert, its page locked
        x_prune = asyncio.create_task(EventReplayStore(x).prune(replay.id, DAY, 10, DAY))
        await held(connection, x.get_server_pid())
        # B read the pass at item 4 too, items 4 and 5 locked by X: its page is empty, position 4
        b_prune = asyncio.create_task(EventReplayStore(b).prune(replay.id, DAY, 10, DAY))
        await held(connection, b.get_server_pid())
        await connection.execute("SELECT pg_advisory_unlock(1)")
        assert await x_prune == (2, False)  # the pass is over, begun two days ago
        # A begins the next pass at the first item left: heartbeat, still archived
        assert await EventReplayStore(a).prune(replay.id, DAY, 1, DAY) == (0, True)
        assert (
            await connection.fetchval("SELECT next_item FROM event_replay_prune_passes WHERE replay_id = $1", replay.id)
            == 2
        )
        await connection.execute("SELECT pg_advisory_unlock(2)")
        assert await b_prune == (0, False)
        # the new pass goes on from item 2: old_1 and old_2 have no page, and go at the next round
        assert (
            await connection.fetchval("SELECT next_item FROM event_replay_prune_passes WHERE replay_id = $1", replay.id)
            == 2
        )
        await ArchiveUpkeep(ArchiveStore(connection), SOURCES).prune()
        left = [
            row["key"]
            for row in await connection.fetch(
                "SELECT key FROM event_replay_items WHERE replay_id = $1 ORDER BY item", replay.id
            )
        ]
        assert left == ["acme:heartbeat"]
    finally:
        for other in (x, b, a):
            await other.close()
        await connection.close()
