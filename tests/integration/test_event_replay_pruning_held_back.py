"""An ended replay's items whose events left the archive, once held back
by its oldest item's key arriving again and again (attacker review of
2a0ce2d). design.md ("Replay items pruned") says the items "last while
their events are archived"; the upkeep took only replays whose oldest item
left was gone and stopped at the first still archived, so one key archived
again on every kept day — a provider resending one event id, a source
hashing a recurring identical body (`sha256:…` ids: a heartbeat) — kept
every later item of the replay for ever, events long gone. Now each replay
is walked in passes (migration 0025): an archived item is skipped, and
read again by the next pass, a day on at the soonest, so a round reads a
bounded page whatever is archived. Real Postgres."""

import asyncio
from datetime import timedelta

import asyncpg

from tests.support.archive import archived_event, seed_archive
from tests.support.pruning import A_WEEK_ON, DAY, MIDNIGHT, SOURCES, TOMORROW, YESTERDAY
from webhook_ingest.shared import upkeep as archive_upkeep
from webhook_ingest.shared.archive.search import parse_filter
from webhook_ingest.shared.archive.store import ArchiveStore
from webhook_ingest.shared.audit.actor import Actor
from webhook_ingest.shared.replays.store import EventReplayStore
from webhook_ingest.shared.upkeep import ArchiveUpkeep


async def test_items_whose_events_left_the_archive_go_though_the_replay_s_first_key_arrives_again(database):
    # `heartbeat` first (yesterday, and again today: a key that recurs), then two events of yesterday only
    await seed_archive(
        database,
        [
            archived_event("acme", "heartbeat", YESTERDAY),
            archived_event("acme", "old_1", YESTERDAY + timedelta(seconds=1)),
            archived_event("acme", "old_2", YESTERDAY + timedelta(seconds=2)),
            archived_event("acme", "heartbeat", MIDNIGHT + timedelta(seconds=5)),
        ],
    )
    connection = await asyncpg.connect(database)
    try:
        replay = await EventReplayStore(connection).prepare(parse_filter({"source": "acme"}), Actor.cli())
        assert replay.total == 3
        await connection.execute(
            "UPDATE event_replays SET state = 'done', next_item = 4, published = 3,"
            " finished_at = now() - interval '2 days' WHERE id = $1",
            replay.id,
        )
        await ArchiveStore(connection).keep({"acme": timedelta(days=7)}, now=A_WEEK_ON)
        assert await ArchiveStore(connection).event("acme:old_1") is None  # no page: nothing shows its item
        await ArchiveUpkeep(ArchiveStore(connection), SOURCES).prune()
        left = [
            row["key"]
            for row in await connection.fetch(
                "SELECT key FROM event_replay_items WHERE replay_id = $1 ORDER BY item", replay.id
            )
        ]
    finally:
        await connection.close()
    assert left == ["acme:heartbeat"]


async def ended_replay_of_acme(connection) -> int:
    """A replay of every acme event, done two days ago."""
    replay = await EventReplayStore(connection).prepare(parse_filter({"source": "acme"}), Actor.cli())
    await connection.execute(
        "UPDATE event_replays SET state = 'done', next_item = total + 1, published = total,"
        " finished_at = now() - interval '2 days' WHERE id = $1",
        replay.id,
    )
    return replay.id


async def items_of(connection, replay_id: int) -> list[str]:
    return [
        row["key"]
        for row in await connection.fetch(
            "SELECT key FROM event_replay_items WHERE replay_id = $1 ORDER BY item", replay_id
        )
    ]


async def test_a_pass_skips_archived_items_and_reads_them_again_only_a_day_after_it_began(database):
    # heartbeat recurs (yesterday, today, tomorrow); old_1 yesterday only; mid_1 today only
    await seed_archive(
        database,
        [
            archived_event("acme", "heartbeat", YESTERDAY),
            archived_event("acme", "old_1", YESTERDAY + timedelta(seconds=1)),
            archived_event("acme", "mid_1", MIDNIGHT + timedelta(seconds=1)),
            archived_event("acme", "heartbeat", MIDNIGHT + timedelta(seconds=5)),
            archived_event("acme", "heartbeat", TOMORROW),
        ],
    )
    connection = await asyncpg.connect(database)
    try:
        replay_id = await ended_replay_of_acme(connection)
        replays, upkeep = EventReplayStore(connection), ArchiveUpkeep(ArchiveStore(connection), SOURCES)
        await ArchiveStore(connection).keep({"acme": timedelta(days=7)}, now=A_WEEK_ON)  # yesterday goes
        assert await upkeep.prune() == 1
        assert await items_of(connection, replay_id) == ["acme:heartbeat", "acme:mid_1"]
        assert await replays.to_prune(DAY, 20, DAY) == []  # the pass is over: nothing read a minute on
        assert await upkeep.prune() == 0

        await ArchiveStore(connection).keep({"acme": timedelta(days=7)}, now=A_WEEK_ON + timedelta(days=1))
        assert await ArchiveStore(connection).event("acme:mid_1") is None  # today went too: mid_1 has no page
        assert await upkeep.prune() == 0  # the next pass begins a day after this one began
        assert await items_of(connection, replay_id) == ["acme:heartbeat", "acme:mid_1"]

        await connection.execute(
            "UPDATE event_replay_prune_passes SET pass_started_at = now() - interval '25 hours' WHERE replay_id = $1",
            replay_id,
        )
        assert await replays.to_prune(DAY, 20, DAY) == [replay_id]
        assert await upkeep.prune() == 1
        assert await items_of(connection, replay_id) == ["acme:heartbeat"]  # tomorrow's heartbeat is archived
        assert await replays.to_prune(DAY, 20, DAY) == []
    finally:
        await connection.close()


async def test_a_round_reads_a_bounded_page_of_a_replay_whatever_is_archived(database, monkeypatch):
    monkeypatch.setattr(archive_upkeep, "PRUNE_PAGE", 3)
    monkeypatch.setattr(archive_upkeep, "PRUNE_STATEMENTS", 2)
    # 20 events of today, every one still archived: nothing to delete, and each round reads six items on
    await seed_archive(
        database, [archived_event("acme", f"kept_{n}", MIDNIGHT + timedelta(seconds=n)) for n in range(1, 21)]
    )
    connection = await asyncpg.connect(database)
    try:
        replay_id = await ended_replay_of_acme(connection)
        upkeep = ArchiveUpkeep(ArchiveStore(connection), SOURCES)
        positions = []
        for _ in range(5):
            assert await upkeep.prune() == 0
            positions.append(
                await connection.fetchval(
                    "SELECT next_item FROM event_replay_prune_passes WHERE replay_id = $1", replay_id
                )
            )
        assert positions == [7, 13, 19, 21, 21]
        assert await EventReplayStore(connection).to_prune(DAY, 20, DAY) == []
        assert len(await items_of(connection, replay_id)) == 20
    finally:
        await connection.close()


async def upkeeps_at_once(connection, upkeeps: list[ArchiveUpkeep]) -> int:
    """Rounds of every upkeep at once until no pass has items to read; items deleted."""
    rounds: list[list[int]] = []
    while len(rounds) < 40 and await EventReplayStore(connection).to_prune(DAY, 20, DAY):
        rounds.append(await asyncio.gather(*(upkeep.prune() for upkeep in upkeeps)))
        assert all(count <= 3 * 2 for count in rounds[-1])
    assert len(rounds) < 40
    return sum(map(sum, rounds))


async def test_upkeeps_at_once_share_a_pass_behind_a_recurring_first_key(database, monkeypatch):
    monkeypatch.setattr(archive_upkeep, "PRUNE_PAGE", 3)
    monkeypatch.setattr(archive_upkeep, "PRUNE_STATEMENTS", 2)
    arrivals = [
        archived_event("acme", "heartbeat", YESTERDAY),
        archived_event("acme", "heartbeat", MIDNIGHT),
        archived_event("acme", "heartbeat", TOMORROW),
    ]
    arrivals += [archived_event("acme", f"old_{n}", YESTERDAY + timedelta(seconds=n)) for n in range(1, 31)]
    arrivals += [archived_event("acme", f"kept_{n}", MIDNIGHT + timedelta(seconds=n)) for n in range(1, 11)]
    await seed_archive(database, arrivals)
    connection = await asyncpg.connect(database)
    others = [await asyncpg.connect(database) for _ in range(3)]
    try:
        first, second = await ended_replay_of_acme(connection), await ended_replay_of_acme(connection)
        await ArchiveStore(connection).keep({"acme": timedelta(days=7)}, now=A_WEEK_ON)
        upkeeps = [ArchiveUpkeep(ArchiveStore(other), SOURCES) for other in others]
        assert await upkeeps_at_once(connection, upkeeps) == 2 * 30  # each gone item deleted once
        kept = ["acme:heartbeat"] + [f"acme:kept_{n}" for n in range(1, 11)]
        assert await items_of(connection, first) == kept
        assert await items_of(connection, second) == kept
        assert [await upkeep.prune() for upkeep in upkeeps] == [0, 0, 0]

        # today goes too, and a day on the upkeeps all begin the next passes at once: one pass each, shared
        await ArchiveStore(connection).keep({"acme": timedelta(days=7)}, now=A_WEEK_ON + timedelta(days=1))
        await connection.execute("UPDATE event_replay_prune_passes SET pass_started_at = now() - interval '25 hours'")
        assert await upkeeps_at_once(connection, upkeeps) == 2 * 10
        assert await items_of(connection, first) == await items_of(connection, second) == ["acme:heartbeat"]
        assert (
            await connection.fetchval(
                "SELECT count(*) FROM event_replay_prune_passes WHERE pass_started_at > now() - interval '1 hour'"
            )
            == 2
        )
    finally:
        for other in others:
            await other.close()
        await connection.close()
