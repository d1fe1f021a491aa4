"""The worker's state machine at its edges, against the real Postgres and
Redis: a turn held in Postgres, a completion committed while we waited, a
handler's own InterfaceError, a conflict's lock, a lock that cannot be kept,
and retention running beside a refreshed fence.

`Processor` runs in the test process; the failure policy only records what
it was asked to do (the broker side of retries is tested elsewhere).
"""

import asyncio
import contextlib
import time
from datetime import timedelta

import asyncpg
import pytest
import redis.asyncio as redis

from tests.conftest import REDIS_URL
from tests.support.events import make_event
from tests.support.processes import wait_until
from webhook_ingest.shared.db.queries import load_queries
from webhook_ingest.shared.sources.model import load_sources
from webhook_ingest.workers.claim import processor as processor_module
from webhook_ingest.workers.claim.completions import CompletionStore
from webhook_ingest.workers.claim.idempotency import Claim, IdempotencyStore
from webhook_ingest.workers.claim.lease import CONFIRM_MARGIN, Keeper, LockLost, cancelled_when_lost
from webhook_ingest.workers.claim.processor import Processor
from webhook_ingest.workers.claim.states import ClaimState, Outcome
from webhook_ingest.workers.worker import Worker

WORKERS_SQL = load_queries("webhook_ingest.workers")
CALLS: list[str] = []


class RecordingFailures:
    """Stands in for FailurePolicy: what the processor asked for, nothing sent."""

    def __init__(self):
        self.delayed: list[tuple[str, float]] = []
        self.failed: list[BaseException] = []

    async def delay(self, event, delay_seconds: float) -> None:
        self.delayed.append((event.key, delay_seconds))

    async def fail(self, event, source, exc: BaseException) -> Outcome:
        self.failed.append(exc)
        return Outcome.RETRIED


STARTED: list[str] = []


async def slow_caller(event, ctx):
    """Waits on the network, then makes its outside call, then writes."""
    STARTED.append(event.key)
    await asyncio.sleep(0.3)
    CALLS.append(event.key)
    await ctx.db.execute("SELECT 1")


async def counting_handler(event, ctx):
    CALLS.append(event.key)
    await ctx.db.execute("SELECT 1")


async def concurrent_queries_on_ctx_db(event, ctx):
    """A handler bug: two queries at once on one connection (asyncpg's InterfaceError)."""
    await asyncio.gather(ctx.db.fetchval("SELECT pg_sleep(0.05)"), ctx.db.fetchval("SELECT 1"))


@pytest.fixture
async def pool(database):
    pool = await asyncpg.create_pool(database, min_size=1, max_size=4)
    yield pool
    await pool.close()


@pytest.fixture
def sources(tmp_path):
    def write(handler: str):
        path = tmp_path / "sources.toml"
        path.write_text(f'[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["s"]\nhandler = "{handler}"\n')
        return load_sources(str(path))

    return write


@pytest.fixture
async def store(namespace, redis_cleanup):
    store = IdempotencyStore((REDIS_URL,), namespace, lock_ttl=30, done_ttl=60)
    yield store
    await store.close()


def make_processor(sources, store, pool, handler="tests.integration.workers.claim.test_processor:counting_handler"):
    CALLS.clear()
    failures = RecordingFailures()
    return Processor(sources(handler), store, CompletionStore(pool), failures), failures


async def test_a_turn_held_in_postgres_defers_a_redis_locked_run(sources, store, pool):
    """Mixed modes: a degraded worker (no Redis) holds the key's turn; one
    that won the Redis lock must not query beside it: ctx.db takes the turn
    at the handler's first query, which is refused, and the run deferred."""
    processor, failures = make_processor(sources, store, pool)
    event = make_event("acme", "evt_turn")
    async with pool.acquire() as holder, holder.transaction():
        await holder.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", event.key)
        outcome = await processor.process(event)
    assert outcome is Outcome.DEFERRED
    assert CALLS == [event.key]  # started, stopped at its first query
    assert failures.delayed == [(event.key, processor_module.DEFER_SECONDS)]
    assert await pool.fetchval("SELECT count(*) FROM processed_events WHERE key = $1", event.key) == 0
    assert (await store.claim(event.key)).state.value == "acquired"  # the Redis lock was given back


async def test_a_completion_committed_while_we_waited_for_the_lease_is_seen(sources, store, pool):
    """The stale-snapshot bug: the previous holder commits its completion
    (ending its lease) while we wait for the lease; we must see that
    completion and not run the handler."""
    processor, _ = make_processor(sources, store, pool)
    event = make_event("acme", "evt_stale")
    async with pool.acquire() as holder:
        await holder.execute(
            "INSERT INTO key_fences (key, token, lease_until) VALUES ($1, 1, now() + interval '1 min')", event.key
        )
        transaction = holder.transaction()
        await transaction.start()
        await holder.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", event.key)
        await holder.execute(
            "INSERT INTO processed_events (key, source, event_id, payload_sha256, fencing_token, attempts)"
            " VALUES ($1, 'acme', $2, $3, 1, 1)",
            event.key,
            event.event_id,
            event.payload_sha256,
        )
        await holder.execute("UPDATE key_fences SET lease_until = NULL WHERE key = $1", event.key)
        running = asyncio.create_task(processor._run(event))
        await asyncio.sleep(0.2)  # it waits for the fence row now
        await transaction.commit()
        outcome = await running
    assert outcome is Outcome.DUPLICATE
    assert CALLS == []


async def test_a_stall_past_the_lease_lets_no_copy_in_the_process_take_the_key(
    sources, namespace, redis_cleanup, database
):
    """Copies of a key this process is running (a degraded worker's, or
    past the Redis rechecks) wait for the lease, or arrive as the process
    wakes. The process stalls past the lease (a GC pause, SIGSTOP): on
    waking, a copy must not take the key from its holder, whose renewal
    comes a moment later and would have found it still its own; the
    holder's outside call would be made twice. Which statement Postgres
    hears first is a race: a few stalls."""
    store = IdempotencyStore((REDIS_URL,), namespace, lock_ttl=1.5, done_ttl=60)
    pool = await asyncpg.create_pool(database, min_size=4, max_size=12)
    processor, _ = make_processor(
        sources, store, pool, handler="tests.integration.workers.claim.test_processor:slow_caller"
    )
    degraded = Claim(ClaimState.UNAVAILABLE)
    keys = []
    try:
        for stall in range(3):
            STARTED.clear()
            events = [make_event("acme", f"evt_stall_{stall}_{i}") for i in range(2)]
            keys += [event.key for event in events]
            holders = [asyncio.create_task(processor.process_claimed(event, degraded)) for event in events]

            async def all_started() -> bool:
                return len(STARTED) == len(events)  # noqa: B023 - awaited in this round

            await wait_until(all_started, 5, interval=0.005, message="every holder's handler started")
            waiting = [asyncio.create_task(processor.process_claimed(event, degraded)) for event in events]
            await asyncio.sleep(0.05)  # the copies wait for the lease
            time.sleep(2.0)  # noqa: ASYNC251 - the whole process stands still past the 1.5 s lease
            arriving = [asyncio.create_task(processor.process_claimed(event, degraded)) for event in events]
            await asyncio.gather(*holders, *waiting, *arriving)
    finally:
        await pool.close()
        await store.close()
    assert sorted(CALLS) == sorted(keys)  # each outside call once


async def test_a_lease_outlives_its_holders_session(sources, store, pool):
    """A holder whose Postgres session died (its turn gone with it) keeps
    the key leased: nobody else runs it until the lease ran out."""
    processor, failures = make_processor(sources, store, pool)
    event = make_event("acme", "evt_partitioned")
    async with pool.acquire() as holder:  # took the lease, then its session died
        await holder.execute(
            "INSERT INTO key_fences (key, token, lease_until) VALUES ($1, 1, now() + interval '1 min')", event.key
        )
    assert await processor._run(event) is Outcome.DEFERRED
    assert CALLS == [] and failures.delayed == [(event.key, processor_module.DEFER_SECONDS)]
    async with pool.acquire() as connection:  # the lease ran out
        await connection.execute("UPDATE key_fences SET lease_until = now() - interval '1 s' WHERE key = $1", event.key)
    assert await processor._run(event) is Outcome.PROCESSED
    assert CALLS == [event.key]


async def test_a_handlers_own_interface_error_is_a_failure_not_an_outage(sources, store, pool):
    processor, failures = make_processor(
        sources, store, pool, "tests.integration.workers.claim.test_processor:concurrent_queries_on_ctx_db"
    )
    outcome = await asyncio.wait_for(processor.process(make_event("acme", "evt_gather")), 10)
    assert outcome is Outcome.RETRIED
    assert [type(exc).__name__ for exc in failures.failed] == ["InterfaceError"]


async def test_a_conflict_leaves_a_done_marker_not_a_lock_and_the_first_payload_wins(sources, store, pool, namespace):
    processor, _ = make_processor(sources, store, pool)
    first = make_event("acme", "evt_conflict", {"amount": 1})
    assert await processor.process(first) is Outcome.PROCESSED
    client = redis.from_url(REDIS_URL)
    try:
        await client.delete(f"{namespace}:key:{first.key}")  # Redis forgot the completion
        other = make_event("acme", "evt_conflict", {"amount": 2})
        assert await processor.process(other) is Outcome.CONFLICT
        marker = await client.get(f"{namespace}:key:{first.key}")
    finally:
        await client.aclose()
    assert marker == f"done:{first.payload_sha256}".encode()  # not a lock held until its TTL
    assert await processor.process(first) is Outcome.DUPLICATE  # at once, not deferred
    async with pool.acquire() as connection:
        completed = await connection.fetchval("SELECT payload_sha256 FROM processed_events WHERE key = $1", first.key)
        conflicts = await connection.fetchval("SELECT count(*) FROM event_conflicts WHERE key = $1", first.key)
    assert completed == first.payload_sha256 and conflicts == 1
    assert CALLS == [first.key]


class Flaky:
    """A renewal that fails `failures` times, then succeeds (or never)."""

    def __init__(self, failures: int):
        self.failures = failures

    async def __call__(self) -> bool:
        if self.failures > 0:
            self.failures -= 1
            return False
        return True


async def test_a_blip_during_a_long_handler_does_not_cost_the_lock():
    keeper = Keeper("redis", Flaky(failures=2), ttl_seconds=1.5)
    task = asyncio.create_task(keeper.keep())
    await asyncio.sleep(2.5)  # past the first validity: only kept by the retried renewal
    task.cancel()
    keeper.check()  # still ours
    assert not keeper.lost


async def test_a_lock_that_cannot_be_renewed_is_lost_and_refuses_completion():
    keeper = Keeper("postgres", Flaky(failures=10**6), ttl_seconds=0.6)
    task = asyncio.create_task(keeper.keep())
    await asyncio.sleep(1.0)
    task.cancel()
    assert keeper.lost
    with pytest.raises(LockLost):
        keeper.check()


class Answers:
    """A renewal answering `renewed` (None: never, a black hole); counts the asks."""

    def __init__(self, renewed: bool | None):
        self.renewed = renewed
        self.asked = 0

    async def __call__(self) -> bool:
        self.asked += 1
        if self.renewed is None:
            await asyncio.Event().wait()
        return bool(self.renewed)


async def _kept_through_a_stall(keeper: Keeper, stall: float) -> None:
    """`keeper` kept while the whole process stands still for `stall` seconds
    (a GC pause, SIGSTOP), then until it is renewed past the stall or lost."""
    task = asyncio.create_task(keeper.keep())
    await asyncio.sleep(0)
    time.sleep(stall)  # noqa: ASYNC251 - blocks the loop: no renewal, no timer runs meanwhile
    woke = time.monotonic()
    was_valid_until = keeper.valid_until

    async def settled() -> bool:  # a stall shorter than the TTL wakes with the lease still valid
        return keeper.lost or keeper.valid_until > max(woke, was_valid_until)

    try:
        await wait_until(settled, 5, interval=0.01, message="renewed past the stall, or lost")
    finally:
        task.cancel()


async def test_a_lease_still_ours_after_a_stall_past_its_ttl_is_kept():
    """Issue 35: its own clock says the lease may have run out; Postgres says
    its token is still the key's, so no one took the key: it goes on."""
    renew = Answers(renewed=True)
    keeper = Keeper("postgres", renew, ttl_seconds=0.6)
    await _kept_through_a_stall(keeper, stall=1.0)
    keeper.check()
    assert not keeper.lost and renew.asked >= 1


async def test_a_lease_taken_during_a_stall_is_lost_when_postgres_says_so():
    keeper = Keeper("postgres", Answers(renewed=False), ttl_seconds=0.6)
    await _kept_through_a_stall(keeper, stall=1.0)
    assert keeper.lost and keeper.lost_because == "refused"  # logged: the key was taken, not unanswered


@pytest.mark.parametrize("stall", [0.45, 1.0], ids=["ending-before-the-limit", "ending-past-it"])
async def test_a_lease_nobody_confirms_after_a_stall_is_lost(stall):
    """A black hole after a stall: no answer, so the timer decides, if
    later than after a loop on time (a TTL after asking)."""
    keeper = Keeper("postgres", Answers(renewed=None), ttl_seconds=0.6)
    await _kept_through_a_stall(keeper, stall=stall)
    assert keeper.lost and keeper.lost_because == "unanswered"


class SlowAnswers(Answers):
    """ "Still ours", after `delay` seconds: the answer of a loop busy with
    every run that woke with it (their responses, their commits)."""

    def __init__(self, delay: float):
        super().__init__(renewed=True)
        self.delay = delay

    async def __call__(self) -> bool:
        await asyncio.sleep(self.delay)
        return await super().__call__()


@pytest.mark.parametrize(
    "stall",
    [
        pytest.param(0.45, id="ending-before-the-limit"),
        pytest.param(1.0, id="ending-past-it"),
    ],
)
async def test_a_lease_still_ours_is_kept_whatever_the_stall_when_the_answer_is_slow(stall):
    """TTL 0.6 s: deadline 0.4 s, the limit of an unanswered confirmation
    0.5 s. Woken at 0.45 s, the keeper would have 0.05 s for an answer
    were the stall not counted; woken at 1.0 s, it has a whole TTL. The
    same answer, 0.15 s late, must keep both."""
    keeper = Keeper("postgres", SlowAnswers(delay=0.15), ttl_seconds=0.6)
    await _kept_through_a_stall(keeper, stall=stall)
    assert not keeper.lost


class AnsweredAtTheLimit(Answers):
    """ "Still ours", come in at the very moment the confirmation's limit
    falls due: the answer is there, only not run yet (issue 35, seed 361)."""

    def __init__(self, keeper_of):
        super().__init__(renewed=True)
        self.keeper_of = keeper_of

    async def __call__(self) -> bool:
        self.asked += 1
        keeper = self.keeper_of()
        answer = asyncio.get_running_loop().create_future()
        limit = keeper.valid_until - keeper._ttl * CONFIRM_MARGIN
        asyncio.get_running_loop().call_at(limit, answer.set_result, True)
        return await answer


async def test_an_answer_come_in_when_the_confirmation_is_due_to_be_lost_keeps_the_lease():
    """The limit's timer and the answer run in one loop iteration; the
    answer reaches the keeper one later. Come in, it is no black hole."""
    keeper: Keeper | None = None
    keeper = Keeper("postgres", AnsweredAtTheLimit(lambda: keeper), ttl_seconds=0.6)
    task = asyncio.create_task(keeper.keep())

    async def settled() -> bool:  # its first validity over, so past its first confirmation
        return keeper.lost or keeper.valid_until > first_valid_until

    first_valid_until = keeper.valid_until
    try:
        await wait_until(settled, 5, interval=0.01, message="confirmed or lost")
    finally:
        task.cancel()
    assert not keeper.lost


async def test_prune_keeps_a_fence_refreshed_while_it_waited(pool):
    """`prune` must never delete a fence row a worker just refreshed."""
    async with pool.acquire() as connection:
        await connection.execute(
            "INSERT INTO key_fences (key, token, updated_at) VALUES ('acme:old', 1, now() - interval '40 days')"
        )
        cutoff = await connection.fetchval(WORKERS_SQL["retention_cutoff"], timedelta(days=30))
    async with pool.acquire() as worker, pool.acquire() as pruner:
        transaction = worker.transaction()
        await transaction.start()
        await worker.execute("UPDATE key_fences SET token = 2, updated_at = now() WHERE key = 'acme:old'")
        pruning = asyncio.create_task(pruner.execute(WORKERS_SQL["prune_key_fences"], cutoff, 1000))
        await asyncio.sleep(0.2)  # the DELETE now waits for the worker's row lock
        await transaction.commit()
        await pruning
        assert await worker.fetchval("SELECT token FROM key_fences WHERE key = 'acme:old'") == 2


async def test_the_workers_sessions_ask_the_server_for_tcp_keepalives(settings):
    """A partition leaves the server holding a worker's session (and the
    key's turn in it) until TCP keepalive notices: seconds, not hours. A
    TCP proxy cannot show that (its own kernel answers the probes), so the
    sessions' settings are what is checked."""
    worker = Worker(settings, {})
    pool = await worker._open_pool(1)
    try:
        async with pool.acquire() as connection:
            settings_now = [
                await connection.fetchval(f"SHOW {name}")
                for name in ("tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count")
            ]
    finally:
        await pool.close()
    assert settings_now == ["10", "5", "3"]  # seconds, seconds, probes


class Connection:
    """Stands for the transaction's connection: records that it was closed."""

    terminated = False

    def terminate(self) -> None:
        self.terminated = True


async def _run_until_lost(keeper: Keeper, connection: Connection, handler) -> None:
    keeping = asyncio.create_task(keeper.keep())
    try:
        with cancelled_when_lost(keeper, connection):
            await handler()
    finally:
        keeping.cancel()


async def test_a_handler_whose_lease_cannot_be_renewed_is_cancelled_and_its_session_closed():
    ended = []

    async def external_call():
        try:
            await asyncio.sleep(60)
        finally:
            ended.append("stopped")

    connection = Connection()
    with pytest.raises(LockLost):
        await _run_until_lost(Keeper("postgres", Flaky(failures=10**6), ttl_seconds=0.6), connection, external_call)
    assert ended == ["stopped"] and connection.terminated


async def test_a_handler_that_swallows_its_cancellation_still_does_not_complete():
    async def stubborn():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.sleep(60)
        await asyncio.sleep(0.1)  # and carries on

    with pytest.raises(LockLost):
        await _run_until_lost(Keeper("postgres", Flaky(failures=10**6), ttl_seconds=0.6), Connection(), stubborn)
    assert asyncio.current_task().cancelling() == 0  # our cancellation taken back: nothing left pending


async def test_a_shutdown_that_cancels_a_handler_is_not_taken_for_a_lost_lease():
    connection = Connection()
    running = asyncio.create_task(
        _run_until_lost(Keeper("postgres", Flaky(failures=0), ttl_seconds=0.6), connection, lambda: asyncio.sleep(60))
    )
    await asyncio.sleep(0.1)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert not connection.terminated
