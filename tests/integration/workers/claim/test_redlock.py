"""Redlock against real redis-servers: quorum, release, extend, done markers."""

import asyncio

import pytest
import redis.asyncio as redis

from tests.support.redis_server import RedisServer
from webhook_ingest.workers.claim.redlock import Redlock


@pytest.fixture
def masters():
    servers = [RedisServer().start() for _ in range(3)]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture
async def clients(masters):
    clients = [redis.from_url(s.url, socket_timeout=0.5, socket_connect_timeout=0.5) for s in masters]
    yield clients
    for client in clients:
        await client.aclose()


async def test_at_most_one_of_many_concurrent_acquirers_wins(clients):
    locks = [Redlock(clients, ttl_seconds=5) for _ in range(20)]
    results = await asyncio.gather(*(lock.acquire("k") for lock in locks))
    winners = [r.lock for r in results if r.lock is not None]
    # A split vote (no majority for anyone) is legitimate Redlock behaviour;
    # two winners never are.
    assert len(winners) <= 1
    if not winners:  # the losers gave back what they won: the next try wins
        assert (await Redlock(clients, 5).acquire("k")).lock is not None


async def test_release_only_frees_our_own_lock(clients):
    mine, other = Redlock(clients, 5), Redlock(clients, 5)
    first = (await mine.acquire("k")).lock
    await mine.release(first)
    second = (await other.acquire("k")).lock
    assert second is not None
    await mine.release(first)  # stale release: must not free the other's lock
    assert (await mine.acquire("k")).lock is None


async def test_quorum_survives_one_dead_master_but_not_two(clients, masters):
    lock = Redlock(clients, 5)
    masters[0].kill()
    result = await lock.acquire("a")
    assert result.lock is not None and result.reachable == 2
    masters[1].kill()
    result = await lock.acquire("b")
    assert result.lock is None and result.reachable == 1


# A TTL of 1 s renewed every 0.5 s: three renewals outlive the first TTL,
# with room for a loaded host's late timer (0.3 s and 0.15 s were not: at
# load 16 a lock ran out between two renewals).
TTL, RENEW_EVERY, RENEWALS = 1.0, 0.5, 3


async def test_extend_keeps_the_lock_past_its_ttl(clients):
    lock = Redlock(clients, ttl_seconds=TTL)
    held = (await lock.acquire("k")).lock
    for _ in range(RENEWALS):
        await asyncio.sleep(RENEW_EVERY)
        held = await lock.extend(held)
        assert held is not None
    assert (await Redlock(clients, TTL).acquire("k")).lock is None


async def test_extend_many_keeps_each_lock_still_ours_and_no_other(clients, masters):
    lock = Redlock(clients, ttl_seconds=TTL)
    kept, expired, replaced = [(await lock.acquire(key)).lock for key in ("kept", "expired", "replaced")]
    await clients[0].script_flush()  # the pipeline loads the script where a master forgot it
    await lock.release(expired)
    await lock.release(replaced)
    other = (await Redlock(clients, 5).acquire("replaced")).lock
    assert other is not None
    masters[2].kill()  # two masters are still a quorum
    for _ in range(RENEWALS):
        await asyncio.sleep(RENEW_EVERY)
        extended = await lock.extend_many([kept, expired, replaced])
        assert extended[1:] == [None, None]
        assert extended[0] is not None and extended[0].valid_until > kept.valid_until
        kept = extended[0]
    assert (await Redlock(clients, TTL).acquire("kept")).lock is None  # still ours past its first TTL
    assert (await Redlock(clients, 5).acquire("replaced")).lock is None  # the other's lock untouched


async def test_a_done_marker_is_reported_to_acquirers(clients):
    lock = Redlock(clients, 5)
    assert await lock.set_everywhere("k", "done:abc", 60) == 3
    result = await lock.acquire("k")
    assert result.lock is None and result.holder_value == "done:abc"
