"""IdempotencyStore against a real Redis: the claims and done markers of
many runs in flight at once go in a few pipelines, each run still getting
its own key's answer (issue 39: a `forward` run cost two round trips of its own)."""

import asyncio

import pytest

from tests.conftest import REDIS_URL
from webhook_ingest.workers.claim import idempotency
from webhook_ingest.workers.claim.idempotency import IdempotencyStore
from webhook_ingest.workers.claim.states import ClaimState

RUNS = 300  # more than a default worker's 256 in flight: two pipelines' worth


@pytest.fixture
async def store(namespace, redis_cleanup):
    store = IdempotencyStore((REDIS_URL,), namespace, lock_ttl=30, done_ttl=60)
    yield store
    await store.close()


@pytest.fixture
def pipelines(monkeypatch):
    """How many pipelines of claims and of done markers went to Redis."""
    sent = {"claims": 0, "done markers": 0}
    acquire_many, set_many = idempotency.Redlock.acquire_many, idempotency.Redlock.set_many_everywhere

    async def counted_acquire_many(self, keys):
        sent["claims"] += 1
        return await acquire_many(self, keys)

    async def counted_set_many(self, items, ttl_seconds):
        sent["done markers"] += 1
        return await set_many(self, items, ttl_seconds)

    monkeypatch.setattr(idempotency.Redlock, "acquire_many", counted_acquire_many)
    monkeypatch.setattr(idempotency.Redlock, "set_many_everywhere", counted_set_many)
    return sent


async def test_claims_of_runs_in_flight_share_pipelines(store, pipelines):
    keys = [f"evt_{n}" for n in range(RUNS)]
    claims = await asyncio.gather(*(store.claim(key) for key in keys))
    assert [claim.state for claim in claims] == [ClaimState.ACQUIRED] * RUNS
    assert len({claim.lock.key for claim in claims if claim.lock}) == RUNS  # each its own key's lock
    # pipelines of at most 256 (a writer may start with a part of them)
    assert pipelines["claims"] <= 1 + -(-(RUNS - 1) // idempotency.MAX_BATCH) + idempotency.WRITERS


async def test_done_markers_of_runs_in_flight_share_pipelines(store, pipelines):
    keys = [f"evt_{n}" for n in range(RUNS)]
    await asyncio.gather(*(store.complete(key, f"sha_{key}") for key in keys))
    assert pipelines["done markers"] <= 1 + -(-(RUNS - 1) // idempotency.MAX_BATCH) + idempotency.WRITERS
    claims = await asyncio.gather(*(store.claim(key) for key in keys))
    assert [(claim.state, claim.completed_sha256) for claim in claims] == [
        (ClaimState.COMPLETED, f"sha_{key}") for key in keys
    ]


async def test_a_key_claimed_twice_in_one_pipeline_is_won_once(store, pipelines):
    """Two runs of one key in flight (a redelivery beside its copy): the
    first asker wins, the second hears the key is busy, as it would have
    from a round trip of its own."""
    first, second, *others = await asyncio.gather(
        store.claim("evt_lone"), store.claim("evt_twice"), store.claim("evt_twice"), store.claim("evt_other")
    )
    assert first.state is ClaimState.ACQUIRED
    assert (second.state, others[0].state, others[1].state) == (
        ClaimState.ACQUIRED,
        ClaimState.BUSY,
        ClaimState.ACQUIRED,
    )
    assert pipelines["claims"] == 1  # asked for in one turn of the loop: one pipeline
