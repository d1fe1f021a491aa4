"""The frozen selections of ended replays, pruned by the archive's upkeep
(docs/reference.md §8, "Replaying archived events"; docs/design.md, "Replay
items pruned"): an item of a `done` or `cancelled` replay goes once
no arrival of its event is archived (its event's page is gone) and the
replay ended a day ago; a replay that can still run keeps every item, and
what a replay's page and an event's page show is unchanged. Real Postgres."""

import asyncio
from datetime import timedelta

import asyncpg
import pytest

from tests.support.archive import archived_event, seed_archive
from tests.support.processes import wait_until
from tests.support.pruning import A_WEEK_ON, MIDNIGHT, SOURCES, YESTERDAY
from webhook_ingest.shared import upkeep as archive_upkeep
from webhook_ingest.shared.archive.search import parse_filter
from webhook_ingest.shared.archive.store import ArchiveStore
from webhook_ingest.shared.audit.actor import Actor
from webhook_ingest.shared.replays.store import EventReplayStore
from webhook_ingest.shared.upkeep import ArchiveUpkeep

TODAY = MIDNIGHT + timedelta(milliseconds=10)  # a day still kept
RETENTION = {"acme": timedelta(days=7)}

# Each replay's state, and how long ago it ended (None: it has not).
REPLAYS = {
    "done": ("done", timedelta(days=2)),
    "cancelled": ("cancelled", timedelta(days=2)),
    "done_lately": ("done", timedelta(hours=1)),
    "running": ("running", None),
    "stalled": ("running", None),
    "failed": ("failed", None),
    "prepared": ("prepared", None),
}


@pytest.fixture
async def connection(database):
    connection = await asyncpg.connect(database)
    yield connection
    await connection.close()


async def replays_of_a_window(database: str, connection, olds: int = 2) -> dict[str, int]:
    """acme's events old_1.. and `copied` received yesterday (copied again
    today), `new` today; a replay of them in each state of REPLAYS (its
    progress as if run to its end, or half-way), then yesterday dropped."""
    arrivals = [archived_event("acme", f"old_{n}", YESTERDAY + timedelta(seconds=n)) for n in range(1, olds + 1)]
    arrivals += [
        archived_event("acme", "copied", YESTERDAY + timedelta(hours=1)),
        archived_event("acme", "copied", TODAY),
        archived_event("acme", "new", TODAY + timedelta(seconds=1)),
    ]
    await seed_archive(database, arrivals)
    store = EventReplayStore(connection)
    ids = {}
    for name, (state, ended) in REPLAYS.items():
        replay = await store.prepare(parse_filter({"source": "acme"}), Actor.cli())
        assert replay.total == olds + 2
        handled = replay.total if ended else replay.total // 2
        await connection.execute(
            "UPDATE event_replays SET state = $2, next_item = $3 + 1, published = $3 - 1, skipped = 1, rate = 10,"
            " started_at = now() - interval '3 days', stepped_at = now() - $4::interval,"
            " finished_at = now() - $5::interval"
            " WHERE id = $1",
            replay.id,
            state,
            handled,
            timedelta(days=1) if name == "stalled" else timedelta(seconds=1),
            ended,
        )
        ids[name] = replay.id
    await ArchiveStore(connection).keep(RETENTION, now=A_WEEK_ON)
    assert await connection.fetchval("SELECT count(*) FROM event_archive WHERE key LIKE 'acme:old_%'") == 0
    return ids


async def items_of(connection, replay_id: int) -> list[str]:
    return [
        row["key"]
        for row in await connection.fetch(
            "SELECT key FROM event_replay_items WHERE replay_id = $1 ORDER BY item", replay_id
        )
    ]


async def test_an_ended_replays_items_go_once_their_events_left_the_archive_and_nothing_shown_changes(
    database, connection
):
    ids = await replays_of_a_window(database, connection)
    replays, archived = EventReplayStore(connection), ArchiveStore(connection)
    pages = {replay_id: (await replays.get(replay_id)).document() for replay_id in ids.values()}
    listed = {key: await replays.replays_of(key) for key in ("acme:old_1", "acme:copied", "acme:new")}
    everything = ["acme:old_1", "acme:old_2", "acme:copied", "acme:new"]

    assert await ArchiveUpkeep(archived, SOURCES).prune() == 4

    for name, replay_id in ids.items():
        # copied is archived still (today's copy), so its item stays: its page lists the replay
        expected = everything[2:] if name in ("done", "cancelled") else everything
        assert await items_of(connection, replay_id) == expected, name
        assert (await replays.get(replay_id)).document() == pages[replay_id], name  # the replay's page
    assert await replays.replays_of("acme:copied") == listed["acme:copied"]  # its page: every replay, as before
    assert await replays.replays_of("acme:new") == listed["acme:new"]
    assert len(listed["acme:copied"]) == len(ids)
    assert await archived.event("acme:old_1") is None  # no page any more: nothing showed the pruned items
    left = {replay["id"] for replay in await replays.replays_of("acme:old_1")}
    assert left == {ids[name] for name in ids if name not in ("done", "cancelled")}

    assert await ArchiveUpkeep(archived, SOURCES).prune() == 0  # idempotent


async def test_upkeeps_at_once_prune_in_bounded_statements_and_each_item_once(database, connection, monkeypatch):
    monkeypatch.setattr(archive_upkeep, "PRUNE_PAGE", 3)
    monkeypatch.setattr(archive_upkeep, "PRUNE_STATEMENTS", 2)
    ids = await replays_of_a_window(database, connection, olds=20)
    others = [await asyncpg.connect(database) for _ in range(3)]
    try:
        upkeeps = [ArchiveUpkeep(ArchiveStore(other), SOURCES) for other in others]
        rounds: list[list[int]] = []
        while not rounds or any(rounds[-1]):
            rounds.append(await asyncio.gather(*(upkeep.prune() for upkeep in upkeeps)))
            assert all(count <= 3 * 2 for count in rounds[-1])  # a process's round: two statements of three
            assert len(rounds) < 40
    finally:
        for other in others:
            await other.close()
    assert sum(map(sum, rounds)) == 2 * 20  # done's and cancelled's old events, each deleted once
    assert len(rounds) >= 3
    everything = [f"acme:old_{n}" for n in range(1, 21)] + ["acme:copied", "acme:new"]
    for name, replay_id in ids.items():
        expected = everything[20:] if name in ("done", "cancelled") else everything
        assert await items_of(connection, replay_id) == expected, name


async def test_the_upkeep_every_process_runs_prunes_once_its_archive_is_ready(database, connection):
    ids = await replays_of_a_window(database, connection)
    own = await asyncpg.connect(database)
    upkeep = ArchiveUpkeep(ArchiveStore(own), SOURCES)
    task = asyncio.create_task(upkeep.run())
    try:

        async def pruned() -> bool:
            return len(await items_of(connection, ids["cancelled"])) == 2

        await wait_until(pruned, 10, message="the cancelled replay's items pruned by the upkeep's loop")
        assert upkeep.ready.is_set()
        assert await items_of(connection, ids["done"]) == ["acme:copied", "acme:new"]
        assert len(await items_of(connection, ids["running"])) == 4
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await own.close()
