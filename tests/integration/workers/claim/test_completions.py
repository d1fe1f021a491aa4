"""CompletionStore against real Postgres.

Upgrade order (docs/operations.md, "Upgrading"): the previous release's
workers still complete events after `migrate` applied 0020. Their
statements, verbatim as of 5068c52, against this schema: the completion
goes in once, naming no arrival, and a key completed by either release is
refused to the other (exactly once across the mixed fleet).

`prune` and ordering keys' lanes (docs/design.md, "Ordering keys"): only a
lane with nothing left goes, and an insert racing it either keeps the lane
or makes it anew from seq 1, never over a row of the old one."""

import asyncio
import dataclasses
from datetime import timedelta

import asyncpg
import pytest

from tests.support.events import make_event
from webhook_ingest.shared.event import OrderedStep
from webhook_ingest.shared.event.message import new_arrival
from webhook_ingest.shared.ordering import insert_ordered, ordered_row
from webhook_ingest.workers.claim.completions import SQL, CompletionStore
from webhook_ingest.workers.ordering import LaneStore

PREVIOUS_COMPLETE_EVENT = """
WITH fence AS (
    UPDATE key_fences SET lease_until = NULL WHERE key = $1 AND token = $5 RETURNING token
), resolved AS (
    UPDATE dead_letters SET status = 'completed', updated_at = now()
    WHERE key = $1 AND payload_sha256 = $4 AND event_id = $3 AND status = 'dead' AND EXISTS (SELECT FROM fence)
)
INSERT INTO processed_events (key, source, event_id, payload_sha256, fencing_token, attempts, message_id)
SELECT $1, $2, $3, $4, $5, $6, $7 FROM fence
ON CONFLICT (key) DO NOTHING
RETURNING key
"""

PREVIOUS_COMPLETE_EVENTS = """
WITH batch AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::int[], $7::text[])
        AS b(key, source, event_id, payload_sha256, fencing_token, attempts, message_id)
), fence AS (
    UPDATE key_fences SET lease_until = NULL FROM batch
    WHERE key_fences.key = batch.key AND key_fences.token = batch.fencing_token
    RETURNING key_fences.key
), resolved AS (
    UPDATE dead_letters SET status = 'completed', updated_at = now() FROM batch
    WHERE dead_letters.key = batch.key AND dead_letters.payload_sha256 = batch.payload_sha256
      AND dead_letters.event_id = batch.event_id
      AND dead_letters.status = 'dead' AND batch.key IN (SELECT key FROM fence)
)
INSERT INTO processed_events (key, source, event_id, payload_sha256, fencing_token, attempts, message_id)
SELECT batch.* FROM batch JOIN fence USING (key)
ON CONFLICT (key) DO NOTHING
RETURNING key
"""


@pytest.fixture
async def connection(database):
    connection = await asyncpg.connect(database)
    yield connection
    await connection.close()


def previous_row(event, token: int) -> tuple:
    return (event.key, event.source, event.event_id, event.payload_sha256, token, event.attempt, "m-" + event.event_id)


async def test_the_previous_release_completes_once_naming_no_arrival(connection):
    completions = CompletionStore(connection)
    single, batched = (dataclasses.replace(make_event("acme", f"evt_p{n}"), arrival=new_arrival()) for n in range(2))
    leases = await completions.take_leases(connection, [single.key, batched.key], 5000)
    assert await connection.fetchval(PREVIOUS_COMPLETE_EVENT, *previous_row(single, leases[single.key].token))
    rows = [previous_row(batched, leases[batched.key].token)]
    assert len(await connection.fetch(PREVIOUS_COMPLETE_EVENTS, *map(list, zip(*rows)))) == 1
    assert dict(await connection.fetch("SELECT key, arrival FROM processed_events")) == {
        single.key: None,
        batched.key: None,
    }
    # a copy on a worker of this release, with a lease of its own, finds it completed: nothing inserted
    again = await completions.take_leases(connection, [single.key], 5000)
    assert not await completions.complete_event(connection, single, again[single.key].token)
    assert await connection.fetchval("SELECT count(*) FROM processed_events") == 2


async def test_a_key_this_release_completed_is_refused_to_the_previous_release(connection):
    completions = CompletionStore(connection)
    event = dataclasses.replace(make_event("acme", "evt_p9"), arrival=new_arrival())
    ours = await completions.take_leases(connection, [event.key], 5000)
    assert await completions.complete_event(connection, event, ours[event.key].token)
    theirs = await completions.take_leases(connection, [event.key], 5000)
    assert await connection.fetchval(PREVIOUS_COMPLETE_EVENT, *previous_row(event, theirs[event.key].token)) is None
    assert await connection.fetchval("SELECT arrival FROM processed_events WHERE key = $1", event.key) == event.arrival


async def test_prune_deletes_a_lane_idle_past_the_window(connection):
    """docs/design.md, "Ordering keys" (the plan's §2): `prune` also deletes
    idle lanes (pending 0, free, unblocked, untouched within the window).
    CompletionStore.prune deletes completions and key fences only."""
    completions, lanes = CompletionStore(connection), LaneStore(connection)
    event = dataclasses.replace(make_event("acme", "evt_idle"), arrival=new_arrival())
    await insert_ordered(connection, [ordered_row(event, "acme:sub_1", None)])
    taken = await lanes.take("acme:sub_1", "w1", 5000)
    assert taken is not None
    lease = (await completions.take_leases(connection, [event.key], 5000))[event.key]
    ordered = dataclasses.replace(event, ordered=OrderedStep("acme:sub_1", 1, taken.token, None))
    async with connection.transaction():
        assert await completions.complete_event(connection, ordered, lease.token)
    assert (await lanes.release_if_idle("acme:sub_1", taken.token)).released
    await connection.execute("UPDATE processed_events SET completed_at = now() - interval '2 days'")
    await connection.execute("UPDATE key_fences SET updated_at = now() - interval '2 days'")
    await connection.execute("UPDATE ordering_keys SET updated_at = now() - interval '2 days'")
    await completions.prune(timedelta(days=1))
    assert await connection.fetchval("SELECT count(*) FROM processed_events") == 0  # the completion went
    assert await connection.fetchval("SELECT count(*) FROM ordering_keys") == 0  # and the idle lane with it


async def _lane(connection, lane: str, *ids: str):
    events = [dataclasses.replace(make_event("acme", event_id), arrival=new_arrival()) for event_id in ids]
    return await insert_ordered(connection, [ordered_row(event, lane, None) for event in events])


async def _emptied(connection, lane: str) -> None:
    """The lane's rows gone as its holder's completions take them, nobody holding it."""
    await connection.execute("DELETE FROM ordered_events WHERE lane = $1", lane)
    await connection.execute("UPDATE ordering_keys SET pending = 0 WHERE lane = $1", lane)


async def test_prune_keeps_a_lane_pending_held_blocked_touched_or_with_a_dead_row_left(connection):
    """Only a lane with nothing left goes: one with a row pending, a live
    holder, a block, a skipped dead row (its seqs go on after it) or a
    change within the window stays, with its counter."""
    for lane in ("acme:idle", "acme:pending", "acme:held", "acme:blocked", "acme:skipped", "acme:touched"):
        await _lane(connection, lane, f"evt_{lane[5:]}_1", f"evt_{lane[5:]}_2")
    for lane in ("acme:idle", "acme:held", "acme:blocked", "acme:touched"):
        await _emptied(connection, lane)
    await connection.execute("UPDATE ordered_events SET state = 'dead', dead_letter_id = 7 WHERE lane = 'acme:skipped'")
    await connection.execute("UPDATE ordering_keys SET pending = 0 WHERE lane = 'acme:skipped'")
    await connection.execute(
        "UPDATE ordering_keys SET holder = 'w1', token = 5, lease_until = now() + interval '1 minute'"
        " WHERE lane = 'acme:held'"
    )
    blocked = "UPDATE ordering_keys SET blocked_by = 9, blocked_since = now() WHERE lane = 'acme:blocked'"
    await connection.execute(blocked)
    await connection.execute(
        "UPDATE ordering_keys SET updated_at = now() - interval '2 days' WHERE lane <> $1", "acme:touched"
    )
    await CompletionStore(connection).prune(timedelta(days=1))
    kept = await connection.fetch("SELECT lane, next_seq FROM ordering_keys ORDER BY lane")
    assert [(row["lane"], row["next_seq"]) for row in kept] == [
        ("acme:blocked", 2),
        ("acme:held", 2),
        ("acme:pending", 2),
        ("acme:skipped", 2),
        ("acme:touched", 2),
    ]
    [again] = await _lane(connection, "acme:skipped", "evt_skipped_3")
    assert again.seq == 3  # after the dead rows, not over them


async def test_a_pruned_lane_used_again_starts_at_seq_1_and_wakes(connection):
    await _lane(connection, "acme:sub_1", "evt_a", "evt_b")
    await _emptied(connection, "acme:sub_1")
    await connection.execute("UPDATE ordering_keys SET updated_at = now() - interval '2 days'")
    await CompletionStore(connection).prune(timedelta(days=1))
    assert await connection.fetchval("SELECT count(*) FROM ordering_keys") == 0
    [accepted] = await _lane(connection, "acme:sub_1", "evt_c")
    assert (accepted.seq, accepted.woke) == (1, True)


async def test_an_insert_that_locked_the_lane_first_keeps_it_from_the_prune(connection, database):
    """The ingress's insert holds the idle lane's row (not committed yet)
    while the prune runs: the prune waits for it, finds the lane pending
    and touched once it commits, and leaves it; the seqs go on."""
    await _lane(connection, "acme:sub_1", "evt_a")
    await _emptied(connection, "acme:sub_1")
    await connection.execute("UPDATE ordering_keys SET updated_at = now() - interval '2 days'")
    ingress = await asyncpg.connect(database)
    try:
        async with ingress.transaction():
            [accepted] = await _lane(ingress, "acme:sub_1", "evt_b")
            pruning = asyncio.ensure_future(CompletionStore(connection).prune(timedelta(days=1)))
            await asyncio.sleep(0.3)
            assert not pruning.done()  # waiting for the lane's row
        await asyncio.wait_for(pruning, 10)
    finally:
        await ingress.close()
    assert accepted.seq == 2
    lane = await connection.fetchrow("SELECT next_seq, pending FROM ordering_keys WHERE lane = 'acme:sub_1'")
    assert (lane["next_seq"], lane["pending"]) == (2, 1)


async def test_an_insert_after_the_prune_locked_the_lane_makes_it_anew(connection, database):
    """The prune's statement holds the idle lane's row (its transaction not
    committed yet) when the ingress's insert comes: the insert waits, then
    finds no row and makes the lane anew, its first row seq 1 — nothing of
    the old lane left to meet or to run before."""
    await _lane(connection, "acme:sub_1", "evt_a")
    await _emptied(connection, "acme:sub_1")
    await connection.execute("UPDATE ordering_keys SET updated_at = now() - interval '2 days'")
    ingress = await asyncpg.connect(database)
    try:
        async with connection.transaction():
            cutoff = await connection.fetchval(SQL["retention_cutoff"], timedelta(days=1))
            assert await connection.execute(SQL["prune_idle_lanes"], cutoff, 100) == "DELETE 1"
            inserting = asyncio.ensure_future(_lane(ingress, "acme:sub_1", "evt_b"))
            await asyncio.sleep(0.3)
            assert not inserting.done()  # waiting for the lane's row
        [accepted] = await asyncio.wait_for(inserting, 10)
    finally:
        await ingress.close()
    assert (accepted.seq, accepted.woke) == (1, True)
    lane = await connection.fetchrow("SELECT next_seq, pending FROM ordering_keys WHERE lane = 'acme:sub_1'")
    assert (lane["next_seq"], lane["pending"]) == (1, 1)
