"""An ordered source's dead letter (docs/design.md, "Ordering keys"): its
replay runs it again in place in its lane, nothing published, the block
cleared and the lane woken; its discard deletes its row and frees the
lane. Every path on-call has: `dlq replay`/`discard`, the store's single
acts (the console's buttons, a bulk action's steps), the admin API.
The runner (package B) is stubbed: the dead row and its block are written
here as B's dead-letter step writes them."""

import asyncio

import aio_pika
import asyncpg
import pytest
from click.testing import CliRunner

from tests.support.events import make_event
from tests.support.ingress import queued_events
from tests.support.ordering_lanes import LANE, block_lane, mark_dead
from webhook_ingest.cli.main import main
from webhook_ingest.ingress.console.bulk import _DeadLetterJob
from webhook_ingest.shared.audit import Actor
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.dead_letters import ChangedMeanwhile, DeadLetterStore, record_dead_letter
from webhook_ingest.shared.ordering import blocked_lanes, insert_ordered, lane_state, ordered_row
from webhook_ingest.shared.runs import paced as paced_runs


async def lane_rows(database_url: str, lane: str = LANE) -> list[tuple]:
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(
            "SELECT seq, state, attempt, replay_of, dead_letter_id FROM ordered_events WHERE lane = $1 ORDER BY seq",
            lane,
        )
        state = await lane_state(connection, lane)
        return [tuple(row) for row in rows] + [(state.pending, state.blocked_by) if state else None]
    finally:
        await connection.close()


async def replay_ids(database_url: str, dead_letter_id: int) -> list[int]:
    connection = await asyncpg.connect(database_url)
    try:
        return [
            r["id"]
            for r in await connection.fetch(
                "SELECT id FROM dead_letter_replays WHERE dead_letter_id = $1 ORDER BY id", dead_letter_id
            )
        ]
    finally:
        await connection.close()


@pytest.fixture
async def wake_ups(settings):
    """The ordering queue, declared as the ingress declares it; its messages' lanes, taken off it."""
    connection = await aio_pika.connect(settings.amqp_url)
    channel = await connection.channel()
    queue = await topology.declare_ordering_queue(channel, settings.namespace)

    async def taken() -> list[str | None]:
        lanes = []
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            lanes.append(topology.woken_lane(message))
        return lanes

    yield taken
    await connection.close()


def dlq(*args: str):
    return CliRunner().invoke(main, ["dlq", *args])


async def test_dlq_replay_of_an_ordered_dead_letter_runs_it_in_place_and_wakes_its_lane(settings, wake_ups):
    dead_letter_id = await block_lane(settings.database_url)
    assert [lane.dead_letter_id for lane in await _blocked(settings.database_url)] == [dead_letter_id]

    result = await asyncio.to_thread(dlq, "replay", str(dead_letter_id))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == f"replayed 1: {dead_letter_id}"

    [replay_id] = await replay_ids(settings.database_url, dead_letter_id)
    assert await queued_events(settings.amqp_url, settings.namespace) == []  # nothing published for it
    assert await lane_rows(settings.database_url) == [
        (1, "pending", 1, replay_id, None),  # first again, in its own place, in the replay's chain
        (2, "pending", 1, 0, None),
        (3, "pending", 1, 0, None),
        (3, None),  # all three pending, the block gone
    ]
    assert await wake_ups() == [LANE]
    assert await _blocked(settings.database_url) == []


async def test_dlq_replay_publishes_an_unordered_dead_letter_beside_an_ordered_one(settings, wake_ups):
    ordered = await block_lane(settings.database_url)
    connection = await asyncpg.connect(settings.database_url)
    try:
        plain = await record_dead_letter(connection, make_event("acme", "evt_plain"), [{"type": "RuntimeError"}])
    finally:
        await connection.close()

    result = await asyncio.to_thread(dlq, "replay", "--all")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == f"replayed 2: {ordered}, {plain}"
    assert [event.key for event in await queued_events(settings.amqp_url, settings.namespace)] == ["acme:evt_plain"]
    assert (await lane_rows(settings.database_url))[-1] == (3, None)
    assert await wake_ups() == [LANE]


async def test_dlq_discard_of_an_ordered_dead_letter_deletes_its_row_and_frees_the_lane(settings):
    dead_letter_id = await block_lane(settings.database_url)

    result = await asyncio.to_thread(dlq, "discard", str(dead_letter_id))
    assert result.exit_code == 0, result.stderr
    # The rest of the lane goes on; the CLI has no broker: the workers' watchdog finds it.
    assert await lane_rows(settings.database_url) == [(2, "pending", 1, 0, None), (3, "pending", 1, 0, None), (2, None)]
    assert await _blocked(settings.database_url) == []


async def test_the_consoles_single_acts_replay_in_place_and_discard_and_wake_through_the_store(settings, wake_ups):
    replayed = await block_lane(settings.database_url, "acme:obj_r")
    discarded = await block_lane(settings.database_url, "acme:obj_d")
    woken: list[list[str]] = []

    async def wake(lanes):
        woken.append(list(lanes))

    pool = await asyncpg.create_pool(settings.database_url, min_size=0, max_size=2)
    connection = await aio_pika.connect(settings.amqp_url)
    try:
        store = DeadLetterStore(pool, wake)
        channel = await connection.channel(publisher_confirms=True)
        await topology.declare_events_queue(channel, settings.namespace, settings.delivery_limit)
        await store.replay_if_open(channel, settings.namespace, replayed, Actor("operator", "console"))
        await store.discard_if_open(discarded, Actor("operator", "console"))
        with pytest.raises(ChangedMeanwhile):  # a second click
            await store.replay_if_open(channel, settings.namespace, replayed, Actor("operator", "console"))
        with pytest.raises(ChangedMeanwhile):
            await store.discard_if_open(discarded, Actor("operator", "console"))
    finally:
        await connection.close()
        await pool.close()

    [replay_id] = await replay_ids(settings.database_url, replayed)
    assert (await lane_rows(settings.database_url, "acme:obj_r"))[0] == (1, "pending", 1, replay_id, None)
    assert (await lane_rows(settings.database_url, "acme:obj_r"))[-1] == (3, None)
    assert (await lane_rows(settings.database_url, "acme:obj_d"))[-1] == (2, None)
    assert await wake_ups() == ["acme:obj_r"]  # the replay's own channel
    assert woken == [["acme:obj_d"]]  # the discard's, through the store's waker
    assert await queued_events(settings.amqp_url, settings.namespace) == []


async def test_a_skipped_dead_letter_blocks_nothing_and_its_replay_adds_it_back_in_place(settings, wake_ups):
    """`on_dead_letter = "skip"`: the dead row stays in its place, the lane runs on."""
    connection = await asyncpg.connect(settings.database_url)
    try:
        events = [make_event("acme", f"evt_s{n}") for n in range(2)]
        await insert_ordered(connection, [ordered_row(event, LANE, None) for event in events])
        dead_letter_id = await record_dead_letter(connection, events[0], [{"type": "RuntimeError"}])
        await mark_dead(connection, LANE, 1, dead_letter_id, block=False)
        await connection.execute("DELETE FROM ordered_events WHERE lane = $1 AND seq = 2", LANE)  # ran meanwhile
        await connection.execute("UPDATE ordering_keys SET pending = pending - 1 WHERE lane = $1", LANE)
    finally:
        await connection.close()
    assert await _blocked(settings.database_url) == []

    result = await asyncio.to_thread(dlq, "replay", str(dead_letter_id))
    assert result.exit_code == 0, result.stderr
    [replay_id] = await replay_ids(settings.database_url, dead_letter_id)
    assert await lane_rows(settings.database_url) == [(1, "pending", 1, replay_id, None), (1, None)]
    assert await wake_ups() == [LANE]


async def test_two_replays_of_one_ordered_dead_letter_at_once_add_it_once(settings):
    dead_letter_id = await block_lane(settings.database_url)
    results = await asyncio.gather(
        asyncio.to_thread(dlq, "replay", str(dead_letter_id)), asyncio.to_thread(dlq, "replay", str(dead_letter_id))
    )
    assert all(result.exit_code == 0 for result in results), [result.stderr for result in results]
    assert len(await replay_ids(settings.database_url, dead_letter_id)) == 1
    assert (await lane_rows(settings.database_url))[-1] == (3, None)  # pending counted once
    # the second, after the first's commit, finds the event waiting in its lane: published, it could overtake
    assert await queued_events(settings.amqp_url, settings.namespace) == []


async def _blocked(database_url: str):
    connection = await asyncpg.connect(database_url)
    try:
        return await blocked_lanes(connection, None, 100)
    finally:
        await connection.close()


class _Publisher:
    """The ingress's publisher, as a bulk runner sees it."""

    def __init__(self, channel):
        self.channel, self.ready = channel, True


async def test_bulk_replay_and_discard_of_ordered_dead_letters_act_in_place_with_their_steps(settings, wake_ups):
    replayed = [await block_lane(settings.database_url, f"acme:obj_r{n}") for n in range(2)]
    discarded = [await block_lane(settings.database_url, f"acme:obj_d{n}") for n in range(2)]
    woken: list[str] = []

    async def wake(lanes):
        woken.extend(lanes)

    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)
    connection = await aio_pika.connect(settings.amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        await topology.declare_events_queue(channel, settings.namespace, settings.delivery_limit)
        store = DeadLetterStore(pool, wake)
        for action, ids in (("replay", replayed), ("discard", discarded)):
            claimed = await store.claim_bulk(await store.prepare_bulk(action, ids, {}, Actor.cli()), 1000)
            assert claimed is not None
            job = _DeadLetterJob(claimed, Actor.cli(), store, _Publisher(channel), settings.namespace)
            assert await paced_runs.run(job) == "done"
            assert (await store.bulk_action(claimed.id)).done == ids
    finally:
        await connection.close()
        await pool.close()

    for n, dead_letter_id in enumerate(replayed):
        [replay_id] = await replay_ids(settings.database_url, dead_letter_id)
        rows = await lane_rows(settings.database_url, f"acme:obj_r{n}")
        assert rows[0] == (1, "pending", 1, replay_id, None) and rows[-1] == (3, None)
    for n in range(2):
        assert (await lane_rows(settings.database_url, f"acme:obj_d{n}"))[-1] == (2, None)
    assert await queued_events(settings.amqp_url, settings.namespace) == []
    assert sorted(await wake_ups()) == ["acme:obj_r0", "acme:obj_r1"]
    assert sorted(woken) == ["acme:obj_d0", "acme:obj_d1"]
