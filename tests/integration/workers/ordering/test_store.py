"""A lane holder's statements (workers/ordering/queries.sql) and the
completion's advance (workers/queries.sql) against real Postgres: a lease
taken over only once it ran out, the advance fenced by the lane's token,
release_if_idle against a concurrent insert, a retry in place, a dead
letter's block, the watchdog's look."""

import asyncio
from dataclasses import replace
from decimal import Decimal

import asyncpg
import pytest

from tests.support.events import make_event
from webhook_ingest.shared.dead_letters import record_dead_letter
from webhook_ingest.shared.event import OrderedStep
from webhook_ingest.shared.ordering import insert_ordered, ordered_row
from webhook_ingest.workers.claim import CompletionStore
from webhook_ingest.workers.ordering import LaneStore

TTL_MS = 3000


@pytest.fixture
async def conn(database):
    connection = await asyncpg.connect(database)
    yield connection
    await connection.close()


@pytest.fixture
async def lanes(conn):
    return LaneStore(conn)


async def add(conn, lane: str, *ids: str, by: Decimal | None = None):
    events = [make_event(lane.partition(":")[0], event_id) for event_id in ids]
    return await insert_ordered(conn, [ordered_row(event, lane, by) for event in events]), events


async def lane_row(conn, lane: str):
    return await conn.fetchrow("SELECT * FROM ordering_keys WHERE lane = $1", lane)


async def test_a_lane_is_taken_once_until_its_lease_ends_then_taken_over(conn, lanes):
    await add(conn, "acme:a", "e1")
    first = await lanes.take("acme:a", "w1", 200)
    assert first is not None and not first.expired
    assert await lanes.take("acme:a", "w2", TTL_MS) is None  # held
    await asyncio.sleep(0.3)
    second = await lanes.take("acme:a", "w2", TTL_MS)
    assert second is not None and second.expired and second.token > first.token
    assert (await lane_row(conn, "acme:a"))["holder"] == "w2"
    assert not await lanes.extend([("acme:a", first.token)], TTL_MS)  # the old holder's renewal is refused
    assert await lanes.extend([("acme:a", second.token)], TTL_MS) == {("acme:a", second.token)}


async def test_an_idle_or_blocked_lane_is_not_taken(conn, lanes):
    assert await lanes.take("acme:none", "w1", TTL_MS) is None
    await add(conn, "acme:b", "e1")
    await conn.execute("UPDATE ordering_keys SET blocked_by = 9, blocked_since = now()")
    assert await lanes.take("acme:b", "w1", TTL_MS) is None


async def complete(completions: CompletionStore, conn, event, seq: int, lane_token: int, by=None, stale=False):
    lease = (await completions.take_leases(conn, [event.key], TTL_MS))[event.key]
    message = replace(event, ordered=OrderedStep("acme:a", seq, lane_token, by, stale))
    async with conn.transaction():
        completed = await completions.complete_event(conn, message, lease.token)
    if not completed:
        await completions.release_leases([lease])  # as the processor does: a refused completion ends nothing
    return completed


async def test_the_completion_advances_the_lane_only_under_the_lanes_current_token(conn, lanes):
    completions = CompletionStore(conn)
    _, (e1, e2) = await add(conn, "acme:a", "e1", "e2", by=Decimal(5))
    old = await lanes.take("acme:a", "w1", 1)
    await asyncio.sleep(0.05)
    new = await lanes.take("acme:a", "w2", TTL_MS)
    assert old is not None and new is not None
    assert not await complete(completions, conn, e1, 1, old.token, Decimal(5))  # fenced: nothing written
    assert await conn.fetchval("SELECT count(*) FROM processed_events") == 0
    assert (await lane_row(conn, "acme:a"))["pending"] == 2
    assert await conn.fetchval("SELECT lease_until IS NOT NULL FROM key_fences WHERE key = $1", e1.key) is False
    assert await complete(completions, conn, e1, 1, new.token, Decimal(5))
    row = await lane_row(conn, "acme:a")
    assert (row["pending"], row["last_by"]) == (1, Decimal(5))
    assert [r["seq"] for r in await conn.fetch("SELECT seq FROM ordered_events")] == [2]
    assert await complete(completions, conn, e2, 2, new.token, Decimal(5), stale=True)
    assert await conn.fetchval("SELECT stale FROM processed_events WHERE key = $1", e2.key)


async def test_complete_events_advances_each_lane_under_its_token(conn, lanes):
    completions = CompletionStore(conn)
    _, (a1,) = await add(conn, "acme:a", "a1", by=Decimal(3))
    _, (b1,) = await add(conn, "acme:b", "b1")
    ta = await lanes.take("acme:a", "w1", TTL_MS)
    tb = await lanes.take("acme:b", "w1", TTL_MS)
    assert ta is not None and tb is not None
    leases = await completions.take_leases(conn, [a1.key, b1.key], TTL_MS)
    batch = [
        (replace(a1, ordered=OrderedStep("acme:a", 1, ta.token, Decimal(3))), leases[a1.key].token),
        (replace(b1, ordered=OrderedStep("acme:b", 1, tb.token + 100, None)), leases[b1.key].token),  # not b's
    ]
    assert await completions.complete_alone(conn, batch) == {a1.key}
    assert [
        (r["lane"], r["pending"], r["last_by"]) for r in await conn.fetch("SELECT * FROM ordering_keys ORDER BY lane")
    ] == [
        ("acme:a", 0, Decimal(3)),
        ("acme:b", 1, None),
    ]


async def test_release_if_idle_keeps_a_lane_an_insert_reached_first(conn, lanes, database):
    await add(conn, "acme:a", "e1")
    taken = await lanes.take("acme:a", "w1", TTL_MS)
    assert taken is not None
    other = await asyncpg.connect(database)
    try:
        await other.execute("BEGIN")
        # an insert holds the lane's row: release_if_idle waits for it, then reads pending on the locked row
        accepted = await insert_ordered(other, [ordered_row(make_event("acme", "e2"), "acme:a", None)])
        assert not accepted[0].woke  # held, with e1 pending
        releasing = asyncio.create_task(lanes.release_if_idle("acme:a", taken.token))
        await asyncio.sleep(0.1)
        assert not releasing.done()
        await other.execute("COMMIT")
        idle = await releasing
        assert idle.ours and not idle.released
        assert await lanes.finish("acme:a", taken.token, 1)
        assert await lanes.finish("acme:a", taken.token, 2)
        idle = await lanes.release_if_idle("acme:a", taken.token)
        assert idle.ours and idle.released
        accepted = await insert_ordered(other, [ordered_row(make_event("acme", "e3"), "acme:a", None)])
        assert accepted[0].woke  # released: the next insert wakes it
    finally:
        await other.close()


async def test_a_retry_in_place_moves_the_row_once_and_the_lane_waits(conn, lanes):
    await add(conn, "acme:a", "e1", "e2")
    taken = await lanes.take("acme:a", "w1", TTL_MS)
    assert taken is not None
    assert await lanes.retry_in_place("acme:a", taken.token, 1, 1, {"type": "Boom"}, 0.5)
    assert await lanes.retry_in_place("acme:a", taken.token, 1, 1, {"type": "Boom"}, 0.5) is False  # once (sent again)
    row = await conn.fetchrow("SELECT attempt, errors FROM ordered_events WHERE seq = 1")
    assert row["attempt"] == 2 and '"Boom"' in row["errors"]
    lane = await lane_row(conn, "acme:a")
    assert lane["holder"] is None and lane["lease_until"] is None and lane["ready_at"] is not None
    assert await lanes.take("acme:a", "w1", TTL_MS) is None  # not before its delay
    [(found, wait)] = await lanes.runnable(["acme"], 10)
    assert found == "acme:a" and 0.3 < wait <= 0.5
    await asyncio.sleep(wait)
    assert await lanes.take("acme:a", "w1", TTL_MS) is not None


async def test_a_retry_in_place_by_a_holder_that_lost_its_lane_moves_nothing(conn, lanes):
    await add(conn, "acme:a", "e1")
    first = await lanes.take("acme:a", "w1", 100)
    assert first is not None
    await asyncio.sleep(0.2)
    second = await lanes.take("acme:a", "w2", TTL_MS)
    assert second is not None
    assert await lanes.retry_in_place("acme:a", first.token, 1, 1, {"type": "Boom"}, 30) is None  # not w1's
    row = await conn.fetchrow("SELECT attempt, errors FROM ordered_events WHERE seq = 1")
    assert (row["attempt"], row["errors"]) == (1, "[]")
    lane = await lane_row(conn, "acme:a")
    assert (lane["holder"], lane["token"], lane["ready_at"]) == ("w2", second.token, None)
    assert lane["lease_until"] is not None


async def test_a_dead_row_blocks_its_lane_or_is_skipped(conn, lanes):
    from webhook_ingest.workers.ordering.store import mark_dead

    await add(conn, "acme:a", "a1", "a2")
    await add(conn, "acme:b", "b1", "b2")
    ta = await lanes.take("acme:a", "w1", TTL_MS)
    tb = await lanes.take("acme:b", "w1", TTL_MS)
    assert ta is not None and tb is not None
    async with conn.transaction():
        assert await mark_dead(conn, "acme:a", ta.token, 1, 1, 41, True, [{"type": "Boom"}])
        assert await mark_dead(conn, "acme:b", tb.token, 1, 1, 42, False, [{"type": "Boom"}])
    a, b = await lane_row(conn, "acme:a"), await lane_row(conn, "acme:b")
    assert (a["pending"], a["blocked_by"], a["holder"]) == (1, 41, None)
    assert (b["pending"], b["blocked_by"], b["holder"]) == (1, None, "w1")  # skip: goes on
    assert await lanes.runnable(["acme"], 10) == []  # a blocked, b held
    assert [
        (r["lane"], r["state"])
        for r in await conn.fetch("SELECT lane, state FROM ordered_events WHERE seq = 1 ORDER BY lane")
    ] == [
        ("acme:a", "dead"),
        ("acme:b", "dead"),
    ]


async def test_the_watchdog_sees_free_lanes_of_its_sources_and_a_lease_ending_within_the_second(conn, lanes):
    await add(conn, "acme:a", "a1")
    await add(conn, "acme:b", "b1")
    await add(conn, "other:c", "c1")
    assert sorted(lane for lane, _ in await lanes.runnable(["acme"], 10)) == ["acme:a", "acme:b"]
    taken = await lanes.take("acme:a", "w1", 600)
    assert taken is not None
    [(_, wait)] = [found for found in await lanes.runnable(["acme"], 10) if found[0] == "acme:a"]
    assert 0.4 < wait <= 0.6  # its lease ends within the second: Postgres says when
    await lanes.extend([("acme:a", taken.token)], TTL_MS)
    assert [lane for lane, _ in await lanes.runnable(["acme"], 10)] == ["acme:b"]
    assert await lanes.runnable(["acme"], 0) == []


async def test_the_sources_with_rows_are_those_with_a_row_waiting_or_a_lane_blocked(conn, lanes):
    """What a worker whose file orders no source asks once (the runner's
    `_watched_sources`): the lanes left when ordering was removed."""
    assert await lanes.sources_with_rows() == set()
    await add(conn, "acme:a", "a1")
    await add(conn, "other:b", "b1")
    await conn.execute("UPDATE ordered_events SET state = 'dead' WHERE lane = 'other:b'")
    await conn.execute(
        "UPDATE ordering_keys SET pending = 0, blocked_by = 9, blocked_since = now() WHERE lane = $1", "other:b"
    )
    assert await lanes.sources_with_rows() == {"acme", "other"}


async def test_page_reads_rows_in_by_order_and_the_hold(conn, lanes):
    events = [make_event("acme", f"e{n}") for n in range(3)]
    await insert_ordered(
        conn,
        [
            ordered_row(events[0], "acme:a", Decimal(2)),
            ordered_row(events[1], "acme:a", None),
            ordered_row(events[2], "acme:a", Decimal(1)),
        ],
    )
    taken = await lanes.take("acme:a", "w1", TTL_MS)
    assert taken is not None
    page = await lanes.page("acme:a", taken.token, 32, 0)
    assert page.ours and page.due_in is None and [row.seq for row in page.rows] == [3, 1, 2]
    held = await lanes.page("acme:a", taken.token, 32, 2.0)
    assert held.due_in is not None and 1.5 < held.due_in <= 2.0
    assert not (await lanes.page("acme:a", taken.token + 1, 32, 0)).ours


async def test_a_lease_that_ran_out_counts_a_delivery_of_the_head_a_release_does_not(conn, lanes):
    await add(conn, "acme:a", "e1", "e2")
    first = await lanes.take("acme:a", "w1", 100)
    assert first is not None
    await asyncio.sleep(0.15)
    second = await lanes.take("acme:a", "w2", 100)  # ran out: the head counts one
    assert second is not None and second.expired
    await lanes.release("acme:a", second.token)
    third = await lanes.take("acme:a", "w3", TTL_MS)  # released: not counted
    assert third is not None and not third.expired
    rows = await conn.fetch("SELECT seq, deliveries FROM ordered_events ORDER BY seq")
    assert [(row["seq"], row["deliveries"]) for row in rows] == [(1, 1), (2, 0)]


async def test_a_dead_letter_of_a_holder_that_lost_its_lane_leaves_no_block_nobody_can_lift(conn, lanes):
    """w1 runs e1's last attempt, stops past its lease (SIGSTOP, a GC pause);
    w2 takes the lane over and runs e1 again (same attempt: nothing moved
    it). w1 wakes, its downstream call timed out meanwhile: e1's dead letter.
    Were `dead` not fenced by the lane's token it would mark e1's row
    (attempt matches) and block the lane; w2's run of e1 succeeds, its
    completion finds the row dead, leaves it, and closes the dead letter as
    `completed`: the lane blocked by a dead letter that is not open, which
    the console's Replay/Discard refuse (ChangedMeanwhile), and once idle it
    takes nothing more, ever. Fenced, w1's `dead` marks nothing (a worker
    rolls its dead letter back: tests/integration/workers/ordering/test_failures.py)."""
    from webhook_ingest.workers.ordering.store import mark_dead

    completions = CompletionStore(conn)
    _, (e1, _) = await add(conn, "acme:a", "e1", "e2")
    old = await lanes.take("acme:a", "w1", 1)
    await asyncio.sleep(0.05)
    new = await lanes.take("acme:a", "w2", TTL_MS)
    assert old is not None and new is not None
    lease = (await completions.take_leases(conn, [e1.key], TTL_MS))[e1.key]  # w2's run of e1
    errors = [{"type": "TimeoutError"}]
    async with conn.transaction():  # w1's dead letter (OrderedFailurePolicy.fail, `beside`)
        dead_letter_id = await record_dead_letter(conn, e1, errors)
        await mark_dead(conn, "acme:a", old.token, 1, 1, dead_letter_id, True, errors)
    message = replace(e1, ordered=OrderedStep("acme:a", 1, new.token, None))
    async with conn.transaction():
        assert await completions.complete_event(conn, message, lease.token)
    lane = await lane_row(conn, "acme:a")
    status = await conn.fetchval("SELECT status FROM dead_letters WHERE id = $1", dead_letter_id)
    assert lane["blocked_by"] is None or status == "dead", (lane["blocked_by"], status)


async def test_the_watchdog_sees_a_routes_lanes_only_when_the_file_has_the_route(conn, lanes):
    """Lanes of a route removed from the file are left out before the `LIMIT`: never taken here,
    they cannot fill a look (webhook_ordering_unknown_lanes counts them)."""
    for route, obj in (("billing", "x1"), ("billing", "x2"), ("audit", "o1")):
        event = make_event("acme", f"evt_{route}_{obj}")
        routed = replace(event, key=f"{event.key}#{route}", route=route)
        await insert_ordered(conn, [ordered_row(routed, f"acme#{route}:{obj}", None)])
    await add(conn, "acme:a", "a1")
    assert sorted(lane for lane, _ in await lanes.runnable(["acme"], 2, routes=["acme#audit"])) == [
        "acme#audit:o1",
        "acme:a",
    ]
    assert [lane for lane, _ in await lanes.runnable(["acme"], 10)] == ["acme:a"]  # no route given: none
