"""Upgrade order (docs/operations.md, "Upgrading"): the previous release's
workers still complete events after `migrate` applied 0020. Their
statements, verbatim as of 5068c52, against this schema: the completion
goes in once, naming no arrival, and a key completed by either release is
refused to the other (exactly once across the mixed fleet)."""

import dataclasses
from datetime import timedelta

import asyncpg
import pytest

from tests.support.events import make_event
from webhook_ingest.shared.event import OrderedStep
from webhook_ingest.shared.event.message import new_arrival
from webhook_ingest.shared.ordering import insert_ordered, ordered_row
from webhook_ingest.workers.claim.completions import CompletionStore
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


@pytest.mark.xfail(
    strict=True,
    reason="prune never deletes an idle lane: ordering_keys keeps a row for every ordering key ever seen",
)
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
