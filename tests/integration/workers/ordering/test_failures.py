"""What a failed ordered row becomes (workers/ordering/failures.py) against
real Postgres: a dead letter that blocks its lane, or none at all when the
lane is no longer its runner's."""

import asyncio
from dataclasses import replace

import asyncpg
import pytest

from tests.support.events import make_event
from webhook_ingest.shared.event import OrderedStep
from webhook_ingest.shared.ordering import insert_ordered, ordered_row
from webhook_ingest.shared.sources.model import parse_source
from webhook_ingest.workers.claim import FailurePolicy, Outcome
from webhook_ingest.workers.ordering import LaneStore, OrderedFailurePolicy

TTL_MS = 3000
SOURCE = parse_source(
    "acme",
    {"scheme": "github", "secrets": ["s"], "handler": "inbox", "max_attempts": 1, "ordering": {"key": "body:id"}},
)


@pytest.fixture
async def pool(database):
    pool = await asyncpg.create_pool(database, min_size=1, max_size=2)
    yield pool
    await pool.close()


@pytest.fixture
async def policy(pool):
    return OrderedFailurePolicy(LaneStore(pool), FailurePolicy(None, pool, "unused"))  # a dead letter needs no channel


async def _last_attempt(pool, lane: str, holder: str, ttl_ms: int):
    event = make_event("acme", "e1")
    await insert_ordered(pool, [ordered_row(event, lane, None)])
    taken = await LaneStore(pool).take(lane, holder, ttl_ms)
    assert taken is not None
    return replace(event, ordered=OrderedStep(lane, 1, taken.token, None))


async def test_a_last_attempt_failing_is_a_dead_letter_that_blocks_its_lane(pool, policy):
    message = await _last_attempt(pool, "acme:a", "w1", TTL_MS)
    assert await policy.fail(message, SOURCE, RuntimeError("boom")) is Outcome.DEAD
    lane = await pool.fetchrow("SELECT * FROM ordering_keys WHERE lane = 'acme:a'")
    dead_letter_id = await pool.fetchval("SELECT id FROM dead_letters WHERE status = 'dead'")
    assert (lane["blocked_by"], lane["holder"], lane["pending"]) == (dead_letter_id, None, 0)


async def test_a_holder_that_lost_its_lane_records_no_dead_letter_and_leaves_the_row_to_the_new_holder(pool, policy):
    """w1's last attempt fails after its lane lease ran out and w2 took the
    lane: w1's dead letter is rolled back (no row, no block, no incident
    count), its outcome a deferral; the row stays pending at its attempt for
    w2, whose own failure is the dead letter that blocks."""
    stale = await _last_attempt(pool, "acme:a", "w1", 1)
    await asyncio.sleep(0.05)
    taken = await LaneStore(pool).take("acme:a", "w2", TTL_MS)
    assert taken is not None
    assert await policy.fail(stale, SOURCE, RuntimeError("timed out")) is Outcome.DEFERRED
    assert await pool.fetchval("SELECT count(*) FROM dead_letters") == 0
    assert await pool.fetchval("SELECT count(*) FROM incidents") == 0
    lane = await pool.fetchrow("SELECT * FROM ordering_keys WHERE lane = 'acme:a'")
    assert (lane["blocked_by"], lane["holder"], lane["pending"]) == (None, "w2", 1)
    row = await pool.fetchrow("SELECT state, attempt FROM ordered_events WHERE lane = 'acme:a'")
    assert (row["state"], row["attempt"]) == ("pending", 1)

    current = replace(stale, ordered=replace(stale.ordered, token=taken.token))
    assert await policy.fail(current, SOURCE, RuntimeError("boom")) is Outcome.DEAD
    lane = await pool.fetchrow("SELECT * FROM ordering_keys WHERE lane = 'acme:a'")
    assert lane["blocked_by"] == await pool.fetchval("SELECT id FROM dead_letters WHERE status = 'dead'")
