"""Ordering keys' shared statements (shared/ordering/) against real Postgres:
the insert numbers each lane densely in commit order, never deadlocks over
overlapping lanes and says once when a lane goes idle -> busy; a dead
letter's replay in place and discard; the reads."""

import asyncio
import random
from dataclasses import replace
from decimal import Decimal

import asyncpg
import pytest

from tests.support.events import make_event
from webhook_ingest.shared.ordering import (
    OrderedRow,
    Waiting,
    blocked_lanes,
    discard_ordered,
    event_of,
    insert_ordered,
    lane_state,
    ordered_row,
    replay_in_place,
    waiting_by_source,
)


@pytest.fixture
async def conn(database):
    connection = await asyncpg.connect(database)
    yield connection
    await connection.close()


def row(lane: str, event_key_id: str, by: Decimal | None = None) -> OrderedRow:
    source, _, route = lane.partition(":")[0].partition("#")
    event = make_event(source, event_key_id)
    return ordered_row(replace(event, route=route, key=f"{event.key}#{route}" if route else event.key), lane, by)


async def seqs(conn, lane: str) -> list[tuple[int, str]]:
    return [
        (r["seq"], r["key"])
        for r in await conn.fetch("SELECT seq, key FROM ordered_events WHERE lane = $1 ORDER BY seq", lane)
    ]


async def test_a_batch_numbers_each_lane_from_one_in_arrival_order(conn):
    rows = [row("acme:a", "e1"), row("acme:b", "e2"), row("acme:a", "e3"), row("acme:a", "e4")]
    accepted = await insert_ordered(conn, rows)
    assert [(a.lane, a.seq, a.woke) for a in accepted] == [
        ("acme:a", 1, True),
        ("acme:b", 1, True),
        ("acme:a", 2, False),
        ("acme:a", 3, False),
    ]
    assert await seqs(conn, "acme:a") == [(1, "acme:e1"), (2, "acme:e3"), (3, "acme:e4")]
    more = await insert_ordered(conn, [row("acme:a", "e5")])
    assert [(a.seq, a.woke) for a in more] == [(4, False)]  # busy already: no second wake-up
    state = await lane_state(conn, "acme:a")
    assert state is not None and (state.next_seq, state.pending, state.value) == (4, 4, "a")


async def test_the_row_carries_the_event_as_published(conn):
    event = replace(make_event("acme", "e1"), route="billing", key="acme:e1#billing", arrival=77, replay_of=3)
    event = replace(event, received_at=round(event.received_at, 3))  # the wire's milliseconds
    await insert_ordered(conn, [ordered_row(event, "acme#billing:a", Decimal("1.5"))])
    stored = await conn.fetchrow("SELECT * FROM ordered_events")
    assert (stored["route"], stored["arrival"], stored["by_value"], stored["replay_of"]) == (
        "billing",
        77,
        Decimal("1.5"),
        3,
    )
    assert event_of(stored["body"], stored["amqp_headers"]) == event
    lane = await conn.fetchrow("SELECT source, route FROM ordering_keys")
    assert tuple(lane) == ("acme", "billing")


async def test_a_lane_wakes_only_when_idle_free_and_unblocked(conn):
    await insert_ordered(conn, [row("acme:a", "e1")])
    await conn.execute("UPDATE ordering_keys SET pending = 0, holder = 'w1', lease_until = now() + interval '1 minute'")
    assert [a.woke for a in await insert_ordered(conn, [row("acme:a", "e2")])] == [False]  # held: its holder goes on
    await conn.execute("UPDATE ordering_keys SET pending = 0, lease_until = now() - interval '1 second'")
    assert [a.woke for a in await insert_ordered(conn, [row("acme:a", "e3")])] == [True]  # its holder's lease ended
    await conn.execute("UPDATE ordering_keys SET pending = 0, holder = NULL, lease_until = NULL, blocked_by = 9")
    assert [a.woke for a in await insert_ordered(conn, [row("acme:a", "e4")])] == [False]  # blocked
    await conn.execute("UPDATE ordering_keys SET pending = 0, blocked_by = NULL")
    assert [a.woke for a in await insert_ordered(conn, [row("acme:a", "e5")])] == [True]


async def test_a_rollback_takes_its_seqs_with_it(conn):
    transaction = conn.transaction()
    await transaction.start()
    await insert_ordered(conn, [row("acme:a", "e1"), row("acme:a", "e2")])
    await transaction.rollback()
    accepted = await insert_ordered(conn, [row("acme:a", "e3")])
    assert [(a.seq, a.woke) for a in accepted] == [(1, True)]


async def test_concurrent_writers_on_one_lane_commit_dense_seqs_in_commit_order(database):
    """9 connections (3 ingress processes' 3 writers) append to one lane, each
    holding its transaction a little and some rolling back; a reader watching
    meanwhile never sees a seq before an earlier one has committed (seq order
    is commit order), and at the end the seqs are 1..n without a gap."""
    lane, writers, rounds = "acme:hot", 9, 12
    stop = asyncio.Event()
    gaps: list[tuple[int, int]] = []

    async def writer(index: int) -> int:
        connection = await asyncpg.connect(database)
        committed = 0
        try:
            for turn in range(rounds):
                batch = [row(lane, f"w{index}-{turn}-{n}") for n in range(random.randint(1, 3))]
                try:
                    async with connection.transaction():
                        await insert_ordered(connection, batch)
                        await asyncio.sleep(random.uniform(0, 0.004))
                        if random.random() < 0.2:
                            raise _RolledBack
                except _RolledBack:
                    continue
                committed += len(batch)
        finally:
            await connection.close()
        return committed

    async def watcher() -> None:
        connection = await asyncpg.connect(database)
        try:
            while not stop.is_set():
                count, top = await connection.fetchrow(
                    "SELECT count(*), coalesce(max(seq), 0) FROM ordered_events WHERE lane = $1", lane
                )
                if count != top:
                    gaps.append((count, top))
        finally:
            await connection.close()

    watching = asyncio.create_task(watcher())
    committed = sum(await asyncio.gather(*(writer(index) for index in range(writers))))
    stop.set()
    await watching
    async with asyncpg.create_pool(database, min_size=1, max_size=1) as pool:
        final = [
            r["seq"] for r in await pool.fetch("SELECT seq FROM ordered_events WHERE lane = $1 ORDER BY seq", lane)
        ]
        counter = await pool.fetchrow("SELECT next_seq, pending FROM ordering_keys WHERE lane = $1", lane)
    assert gaps == []
    assert final == list(range(1, committed + 1))
    assert tuple(counter) == (committed, committed)


class _RolledBack(Exception):
    pass


async def test_overlapping_lanes_in_different_orders_never_deadlock(database):
    """Batches over the same lanes, each in its own shuffled order, from 8
    connections at once, each holding its transaction a little: no
    DeadlockDetected (the counters are locked in lane order), every lane dense."""
    lanes = [f"acme:l{n}" for n in range(6)]
    per_lane: dict[str, int] = dict.fromkeys(lanes, 0)

    async def writer(index: int) -> None:
        connection = await asyncpg.connect(database)
        try:
            for turn in range(15):
                batch = [row(lane, f"w{index}-{turn}-{lane}") for lane in random.sample(lanes, random.randint(2, 6))]
                async with connection.transaction():
                    await insert_ordered(connection, batch)
                    await insert_ordered(connection, batch[::-1][:1])  # a second statement, the reverse order's head
                    await asyncio.sleep(random.uniform(0, 0.003))
                for one in [*batch, batch[-1]]:
                    per_lane[one.lane] += 1
        finally:
            await connection.close()

    await asyncio.gather(*(writer(index) for index in range(8)))
    connection = await asyncpg.connect(database)
    try:
        for lane in lanes:
            assert [seq for seq, _ in await seqs(connection, lane)] == list(range(1, per_lane[lane] + 1))
    finally:
        await connection.close()


async def _dead(conn, lane: str, seq: int, dead_letter_id: int, block: bool = True) -> None:
    """What the holder's dead-letter step leaves: the row dead, not pending, the lane blocked (or not)."""
    await conn.execute(
        "UPDATE ordered_events SET state = 'dead', dead_letter_id = $3, attempt = 5, errors = '[{\"type\": \"E\"}]',"
        " deliveries = 2 WHERE lane = $1 AND seq = $2",
        lane,
        seq,
        dead_letter_id,
    )
    await conn.execute(
        "UPDATE ordering_keys SET pending = pending - 1, blocked_by = CASE WHEN $2 THEN $3::bigint END,"
        " blocked_since = CASE WHEN $2 THEN now() - interval '90 seconds' END WHERE lane = $1",
        lane,
        block,
        dead_letter_id,
    )


async def test_a_replay_in_place_runs_the_dead_row_again_in_its_place_and_frees_the_lane(conn):
    await insert_ordered(conn, [row("acme:a", "e1", Decimal(5)), row("acme:a", "e2"), row("acme:a", "e3")])
    await _dead(conn, "acme:a", 1, dead_letter_id=41)
    assert await replay_in_place(conn, 41, replay_id=8) == "acme:a"
    state = await lane_state(conn, "acme:a")
    assert state is not None
    assert (state.blocked_by, state.blocked_since, state.pending) == (None, None, 3)
    head = state.rows[0]
    assert (head.seq, head.state, head.attempt, head.replay_of, head.deliveries, head.dead_letter_id) == (
        1,
        "pending",
        1,
        8,
        0,
        None,
    )
    assert head.by_value == Decimal(5) and [r.seq for r in state.rows] == [1, 2, 3]
    assert await conn.fetchval("SELECT errors FROM ordered_events WHERE seq = 1") == "[]"
    assert await replay_in_place(conn, 41, replay_id=9) is None  # replayed already: nothing twice
    assert await replay_in_place(conn, 999, replay_id=9) is None  # not an ordered row
    assert await conn.fetchval("SELECT pending FROM ordering_keys WHERE lane = 'acme:a'") == 3


async def test_a_replay_in_place_under_skip_or_after_a_prune_counts_the_row_again(conn):
    await insert_ordered(conn, [row("acme:a", "e1")])
    await _dead(conn, "acme:a", 1, dead_letter_id=42, block=False)
    await conn.execute("DELETE FROM ordering_keys")  # pruned as idle
    assert await replay_in_place(conn, 42, replay_id=1) == "acme:a"
    lane = await conn.fetchrow("SELECT source, pending, blocked_by FROM ordering_keys WHERE lane = 'acme:a'")
    assert tuple(lane) == ("acme", 1, None)


async def test_a_discard_deletes_the_dead_rows_and_frees_the_lanes_they_blocked(conn):
    await insert_ordered(conn, [row("acme:a", "e1"), row("acme:a", "e2"), row("acme:b", "e3"), row("acme:c", "e4")])
    await _dead(conn, "acme:a", 1, dead_letter_id=51)
    await _dead(conn, "acme:b", 1, dead_letter_id=52)
    await _dead(conn, "acme:c", 1, dead_letter_id=53)
    assert await discard_ordered(conn, [52, 51, 77]) == ["acme:a", "acme:b"]
    assert await seqs(conn, "acme:a") == [(2, "acme:e2")]
    assert await seqs(conn, "acme:b") == []
    assert [lane.lane for lane in await blocked_lanes(conn, None, 10)] == ["acme:c"]
    assert await discard_ordered(conn, [51]) == []


async def test_blocked_lanes_show_their_dead_letter_age_and_what_waits(conn):
    await insert_ordered(conn, [row("acme:a", "e1"), row("acme:a", "e2"), row("acme#r:b", "e3"), row("other:c", "e4")])
    await _dead(conn, "acme:a", 1, dead_letter_id=61)
    await _dead(conn, "acme#r:b", 1, dead_letter_id=62)
    await _dead(conn, "other:c", 1, dead_letter_id=63)
    await conn.execute("UPDATE ordering_keys SET blocked_since = now() - interval '1 hour' WHERE lane = 'other:c'")
    every = await blocked_lanes(conn, None, 10)
    assert [(b.lane, b.source, b.route, b.value, b.dead_letter_id, b.waiting) for b in every] == [
        ("other:c", "other", "", "c", 63, 0),
        ("acme:a", "acme", "", "a", 61, 1),
        ("acme#r:b", "acme", "r", "b", 62, 0),
    ]
    assert 3590 < every[0].age_seconds < 3700 and 80 < every[1].age_seconds < 200
    assert [b.lane for b in await blocked_lanes(conn, "acme", 1)] == ["acme:a"]


async def test_a_lanes_rows_show_in_the_order_they_run(conn):
    await insert_ordered(
        conn,
        [
            row("acme:a", "e1", Decimal(30)),
            row("acme:a", "e2"),
            row("acme:a", "e3", Decimal(10)),
            row("acme:a", "e4", Decimal(20)),
        ],
    )
    state = await lane_state(conn, "acme:a")
    assert state is not None and [r.key for r in state.rows] == ["acme:e3", "acme:e4", "acme:e1", "acme:e2"]
    assert (state.holder, state.held, state.last_by, state.route) == (None, False, None, "")
    assert await lane_state(conn, "acme:nowhere") is None


async def test_waiting_by_source_counts_pending_rows_and_blocked_lanes(conn):
    assert await waiting_by_source(conn) == {}
    await insert_ordered(conn, [row("acme:a", "e1"), row("acme:a", "e2"), row("acme:b", "e3"), row("other:c", "e4")])
    await conn.execute("UPDATE ordered_events SET accepted_at = now() - interval '2 minutes' WHERE key = 'acme:e1'")
    await _dead(conn, "other:c", 1, dead_letter_id=71)
    waiting = await waiting_by_source(conn)
    assert set(waiting) == {"acme", "other"}
    assert (waiting["acme"].waiting, waiting["acme"].blocked) == (3, 0)
    assert 119 < waiting["acme"].oldest_seconds < 200
    assert waiting["other"] == Waiting(0, 0.0, 1, waiting["other"].blocked_oldest_seconds)
    assert waiting["other"].blocked_oldest_seconds > 80
