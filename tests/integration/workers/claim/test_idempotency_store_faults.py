"""IdempotencyStore's shared pipelines against three real redis-servers, one
or two of them hung (a TCP proxy that forwards nothing): each caller of a
pipeline still gets its own key's answer on the quorum of the others, or
UNAVAILABLE within the socket timeout, never a hang."""

import asyncio
import time

import pytest
import redis.asyncio as redis

from tests.support.redis_server import RedisServer
from tests.support.tcpproxy import TcpProxy
from webhook_ingest.workers.claim import idempotency
from webhook_ingest.workers.claim.idempotency import IdempotencyStore
from webhook_ingest.workers.claim.states import ClaimState

RUNS = 300  # two pipelines' worth


@pytest.fixture
def masters():
    servers = [RedisServer().start() for _ in range(3)]
    proxies = [TcpProxy("127.0.0.1", server.port).start() for server in servers]
    yield proxies
    for proxy in proxies:
        proxy.stop()
    for server in servers:
        server.stop()


@pytest.fixture
async def store(masters):
    store = IdempotencyStore(tuple(f"redis://127.0.0.1:{p.port}/0" for p in masters), "faults", 30, 60)
    yield store
    await store.close()


async def test_one_master_hung_each_caller_still_gets_its_own_keys_answer(store, masters):
    masters[2].stall()
    keys = [f"evt_{n}" for n in range(RUNS)]
    started = time.monotonic()
    claims = await asyncio.gather(*(store.claim(key) for key in keys))
    assert [claim.state for claim in claims] == [ClaimState.ACQUIRED] * RUNS
    prefix = idempotency.key_prefix("faults")
    assert [claim.lock.key if claim.lock else None for claim in claims] == [prefix + key for key in keys]
    await asyncio.gather(*(store.complete(key, f"sha_{key}") for key in keys))
    again = await asyncio.gather(*(store.claim(key) for key in keys))
    assert [(claim.state, claim.completed_sha256) for claim in again] == [
        (ClaimState.COMPLETED, f"sha_{key}") for key in keys
    ]
    # each pipeline waits the hung master's socket timeout at most, WRITERS of them at once
    assert time.monotonic() - started < 12 * idempotency.SOCKET_TIMEOUT


async def test_two_masters_hung_every_caller_hears_unavailable_soon(store, masters):
    masters[1].stall()
    masters[2].stall()
    claims = await asyncio.gather(*(store.claim(f"evt_{n}") for n in range(RUNS)))
    assert {claim.state for claim in claims} == {ClaimState.UNAVAILABLE}
    assert store.degraded
    # What a caller waited on, counted rather than clocked (a loaded host's
    # clock says more about the host than about the store): each
    # connection made to a hung master is a socket timeout waited (its
    # handshake is never answered). One a pipeline, WRITERS at once, is
    # "within the socket timeout"; anything after it is a caller waiting more.
    made = [masters[1].connections(), masters[2].connections()]
    assert max(made) <= idempotency.WRITERS, made
    async with redis.from_url(f"redis://127.0.0.1:{masters[0].port}/0") as answering:  # what it set there, given back
        assert await answering.keys(idempotency.key_prefix("faults") + "*") == []
    masters[1].flow()
    masters[2].flow()
