"""One lock order on `key_fences` (issue 35, finding 3): a worker's batched
statements lock a key's fence row each, and two of them locking the same
rows in opposite orders deadlocked in a loaded run (`take_leases` in key
order, `extend_leases` in the plan's), crashing every run of the batch
that Postgres chose as the victim.

The interleaving is forced, not waited for: a trigger holds each statement
at its first row, behind an advisory lock the test holds, until both wait.
"""

import asyncio
import contextlib

import asyncpg
import pytest

from tests.support.processes import wait_until
from webhook_ingest.shared.db.queries import load_queries
from webhook_ingest.workers.claim.completions import CompletionStore
from webhook_ingest.workers.claim.lease import Lease

SQL = load_queries("webhook_ingest.shared.dead_letters")
TTL_MS = 60_000  # a renewal's own limit is a third of it: longer than the deadlock check (1 s)
GATE = 4242
GATE_TRIGGER = f"""
CREATE FUNCTION test_gate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.key = current_setting('test.gate', true) THEN
        PERFORM pg_advisory_xact_lock_shared({GATE});
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_gate BEFORE UPDATE ON key_fences FOR EACH ROW EXECUTE FUNCTION test_gate();
"""


@pytest.fixture
async def connections(database):
    """Two workers' sessions and the test's own, on fences `acme:b` then `acme:a`
    (in that order on disk), both leases run out, their tokens 1 and 2."""
    opened = [await asyncpg.connect(database) for _ in range(3)]
    await opened[2].execute(
        "INSERT INTO key_fences (key, token, lease_until) VALUES "
        "('acme:b', 1, now() - interval '1 s'), ('acme:a', 2, now() - interval '1 s')"
    )
    try:
        yield opened
    finally:
        for connection in opened:
            await connection.close()


async def _waiting(observer: asyncpg.Connection, *sessions: asyncpg.Connection) -> bool:
    pids = [session.get_server_pid() for session in sessions]
    waiting = await observer.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[]) AND wait_event_type = 'Lock'", pids
    )
    return waiting == len(pids)


@contextlib.asynccontextmanager
async def gated(test: asyncpg.Connection):
    """Statements reaching their gate row wait until the block ends."""
    await test.execute(GATE_TRIGGER)
    await test.execute("SELECT pg_advisory_lock($1)", GATE)
    try:
        yield
    finally:
        await test.execute("SELECT pg_advisory_unlock($1)", GATE)


async def test_taking_and_renewing_leases_in_opposite_orders_do_not_deadlock(connections):
    """A worker takes the leases of two keys whose leases ran out (its copies)
    while the worker that held them renews them, its batch in another order."""
    taker, holder, test = connections
    await taker.execute("SET test.gate = 'acme:a'")  # holds its first row, acme:a
    await holder.execute("SET test.gate = 'acme:b'")  # holds its first row, acme:b
    async with gated(test):
        taking = asyncio.create_task(CompletionStore(taker).take_leases(taker, ["acme:a", "acme:b"], TTL_MS))
        await wait_until(lambda: _waiting(test, taker), 10, message="the taker at its gate")
        renewing = asyncio.create_task(
            CompletionStore(holder).extend_leases([Lease("acme:b", 1, 0.0), Lease("acme:a", 2, 0.0)], TTL_MS)
        )
        await wait_until(lambda: _waiting(test, taker, holder), 10, message="both statements waiting")
    taken, renewed = await asyncio.gather(taking, renewing, return_exceptions=True)

    assert not isinstance(taken, BaseException) and not isinstance(renewed, BaseException), (taken, renewed)
    assert set(taken) == {"acme:a", "acme:b"}  # the taker was first to the row it locks first
    assert renewed == set()  # so the holder's tokens are not the keys' any more


async def test_a_shared_statement_chosen_as_a_deadlock_victim_is_sent_again(connections):
    """Someone else's transaction (an operator's, an older release's)
    locks the rows in the other order: Postgres ends our statement, which
    rolled back whole and is sent again instead of failing every run in it."""
    taker, _, test = connections
    await test.execute("SET deadlock_timeout = '10s'")  # the taker's check (1 s) finds the cycle first
    async with test.transaction():
        await test.execute("SELECT FROM key_fences WHERE key = 'acme:b' FOR UPDATE")
        taking = asyncio.create_task(CompletionStore(taker).take_leases(taker, ["acme:a", "acme:b"], TTL_MS))
        await wait_until(lambda: _waiting(test, taker), 10, message="the taker waiting for acme:b")
        await test.execute("SELECT FROM key_fences WHERE key = 'acme:a' FOR UPDATE")  # the cycle
    taken = await taking

    assert set(taken) == {"acme:a", "acme:b"}


async def test_a_discard_of_dead_letters_and_a_renewal_do_not_deadlock(connections):
    """On-call discards the dead letters of two keys (`dead-letters
    discard`, one transaction: forget_handed_on updates their fence rows)
    while a worker renews its leases of them (copies of the events still
    running). The discard is the statement Postgres ends when both wait
    (its deadlock check comes first here): nothing of a discard may fail
    for a lock order, since the worker's side locks in key order."""
    discarder, holder, test = connections
    await test.execute("UPDATE key_fences SET payload_sha256 = 'h', lease_until = now() + interval '1 min'")
    ids = [
        await test.fetchval(
            "INSERT INTO dead_letters (key, source, event_id, payload_sha256, body, received_at, attempts) "
            "VALUES ($1, 'acme', $1, 'h', '', now(), 3) RETURNING id",
            key,
        )
        for key in ("acme:b", "acme:a")
    ]
    await holder.execute("SET deadlock_timeout = '10s'")  # the discard's check (1 s) finds the cycle first
    await discarder.execute("SET test.gate = 'acme:b'")  # holds the discard at its first row, acme:b, locked
    async with discarder.transaction():
        async with gated(test):
            forgetting = asyncio.create_task(discarder.execute(SQL["forget_handed_on"], ids))
            await wait_until(lambda: _waiting(test, discarder), 10, message="the discard at its gate")
            with pytest.raises(asyncpg.LockNotAvailableError):  # acme:b locked first (the plan's order), not acme:a
                await test.execute("SELECT FROM key_fences WHERE key = 'acme:b' FOR UPDATE NOWAIT")
            renewing = asyncio.create_task(
                CompletionStore(holder).extend_leases([Lease("acme:a", 2, 0.0), Lease("acme:b", 1, 0.0)], TTL_MS)
            )
            await wait_until(lambda: _waiting(test, discarder, holder), 10, message="both statements waiting")
        forgotten = await asyncio.gather(forgetting, return_exceptions=True)
        assert not isinstance(forgotten[0], BaseException), forgotten  # the discard went through

    assert await renewing == {("acme:a", 2), ("acme:b", 1)}
