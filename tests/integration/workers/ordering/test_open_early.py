"""A hot lane's rows with their `ctx.db` opened as each handler starts
(Processor.OPEN_EARLY_SECONDS, HandlerTransaction.open_early), against the
real Postgres and Redis, through the runner with its page leases: each
row's effect once and in order, and a key's turn held elsewhere still
defers the row unwritten."""

import asyncio
import contextlib

import asyncpg
import pytest

from tests.support.events import make_event
from webhook_ingest.shared.ordering import insert_ordered, ordered_row
from webhook_ingest.shared.sources.model import load_sources
from webhook_ingest.workers.claim import FailurePolicy, Outcome, Processor
from webhook_ingest.workers.claim import processor as claim_processor
from webhook_ingest.workers.claim.completions import CompletionStore
from webhook_ingest.workers.ordering import LaneRunner, LaneStore, OrderedFailurePolicy

RUNS_TABLE = "CREATE TABLE early_runs (id bigserial PRIMARY KEY, key text NOT NULL, turn_before_query bool NOT NULL)"
LOCKS: list[asyncpg.Pool] = []  # the test's pool: the handler looks at pg_locks through it


async def record(event, ctx) -> None:
    """Work until its turn shows in pg_locks (up to a second: no early opening, no turn), then one
    row (not batchable: each row through Processor.run_leased)."""
    turn = False
    for _ in range(50):
        turn = await LOCKS[0].fetchval(
            "SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        )
        if turn:
            break
        await asyncio.sleep(0.02)
    await ctx.db.execute("INSERT INTO early_runs (key, turn_before_query) VALUES ($1, $2)", event.key, turn)


@pytest.fixture
def sources(tmp_path):
    path = tmp_path / "sources.toml"
    path.write_text(
        '[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["s"]\nmax_attempts = 5\nretry_delays = [30]\n'
        'handler = "tests.integration.workers.ordering.test_open_early:record"\n'
        '[sources.acme.ordering]\nkey = "body:object"\n'
    )
    return load_sources(str(path))


@pytest.fixture
def processor(sources, claims, pool, monkeypatch):
    # what counts as "soon" is the unit tests' (tests/unit/workers/claim/test_open_early.py): here
    # a handler that waits up to a second for its turn to show is still opened early
    monkeypatch.setattr(claim_processor, "OPEN_EARLY_SECONDS", 5.0)
    LOCKS[:] = [pool]
    policy = OrderedFailurePolicy(LaneStore(pool), FailurePolicy(None, pool, "unused"))
    return Processor(sources, claims, CompletionStore(pool), policy)


async def accept(pool, versions) -> list[str]:
    events = [make_event("acme", f"evt_a_{v}", {"object": "a", "version": v}) for v in versions]
    await insert_ordered(pool, [ordered_row(event, "acme:a", None) for event in events])
    return [event.key for event in events]


async def drain(pool, sources, processor, settled=lambda _event, _outcome, _started: None) -> None:
    runner = LaneRunner(
        LaneStore(pool), processor.run_ordered, sources, set(), "w1", 4, 30_000, settled, pages=processor
    )
    runner.offer("acme:a")
    async with asyncio.timeout(30):
        while runner.held():  # noqa: ASYNC110 - the runner has no event to wait on: polled
            await asyncio.sleep(0.02)


async def test_a_hot_lanes_rows_run_once_in_order_their_turn_taken_before_their_first_query(sources, processor, pool):
    keys = await accept(pool, range(1, 41))
    await drain(pool, sources, processor)
    runs = await pool.fetch("SELECT key, turn_before_query FROM early_runs ORDER BY id")
    assert [run["key"] for run in runs] == keys  # each once, in order
    assert [run["turn_before_query"] for run in runs] == [False] + [True] * 39
    assert await pool.fetchval("SELECT count(*) FROM processed_events") == 40
    assert await pool.fetchval("SELECT count(*) FROM ordered_events") == 0


async def test_a_turn_held_elsewhere_when_the_early_opening_asks_defers_the_row_unwritten(sources, processor, pool):
    first, second = await accept(pool, (1, 2))
    outcomes: list[Outcome] = []
    async with pool.acquire() as other, other.transaction():
        # another run's transaction holds e2's turn (a holder that lost its lease, still running)
        await other.fetchval("SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))", second)
        await drain(pool, sources, processor, lambda _event, outcome, _started: outcomes.append(outcome))
        assert outcomes == [Outcome.PROCESSED, Outcome.DEFERRED]
        assert [row["key"] for row in await pool.fetch("SELECT key FROM early_runs")] == [first]
    await pool.execute("UPDATE ordering_keys SET ready_at = NULL")  # the deferral's second, not waited out
    await drain(pool, sources, processor)
    assert [row["key"] for row in await pool.fetch("SELECT key FROM early_runs ORDER BY id")] == [first, second]


CALLS_TABLE = "CREATE TABLE early_calls (id bigserial PRIMARY KEY, key text NOT NULL)"


async def query_or_call(event, ctx) -> None:
    """An odd version writes through ctx.db at once; an even one only calls the outside world
    (a row in `early_calls` through the test's pool: a payment API's charge), no ctx.db."""
    if event.payload["version"] % 2:
        await ctx.db.execute("INSERT INTO early_runs (key, turn_before_query) VALUES ($1, false)", event.key)
    else:
        await LOCKS[0].execute("INSERT INTO early_calls (key) VALUES ($1)", event.key)
        await asyncio.sleep(0.2)  # the API's answer: longer than the early opening takes


@pytest.fixture
def mixed_processor(tmp_path, claims, pool, monkeypatch):
    path = tmp_path / "mixed.toml"
    path.write_text(
        '[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["s"]\nmax_attempts = 5\nretry_delays = [30]\n'
        'handler = "tests.integration.workers.ordering.test_open_early:query_or_call"\n'
        '[sources.acme.ordering]\nkey = "body:object"\n'
    )
    sources = load_sources(str(path))
    monkeypatch.setattr(claim_processor, "OPEN_EARLY_SECONDS", 5.0)  # row 1's query is soon, however loaded
    LOCKS[:] = [pool]
    policy = OrderedFailurePolicy(LaneStore(pool), FailurePolicy(None, pool, "unused"))
    return sources, Processor(sources, claims, CompletionStore(pool), policy)


async def test_a_refused_early_turn_does_not_defer_a_handler_that_never_queried(mixed_processor, pool):
    """Row 1 queries at once, so row 2's ctx.db opens early; row 2's handler only calls out. A
    stale holder holds row 2's turn: opened at its first query, row 2 would never have asked for
    it and completed alone, its call made once. The early opening's refusal must not undo that."""
    sources, processor = mixed_processor
    await pool.execute(CALLS_TABLE)
    _, second = await accept(pool, (1, 2))
    outcomes: list[Outcome] = []
    async with pool.acquire() as other, other.transaction():
        await other.fetchval("SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))", second)
        await drain(pool, sources, processor, lambda _event, outcome, _started: outcomes.append(outcome))
    await pool.execute("UPDATE ordering_keys SET ready_at = NULL")  # a deferral's second, not waited out
    await drain(pool, sources, processor, lambda _event, outcome, _started: outcomes.append(outcome))
    assert [row["key"] for row in await pool.fetch("SELECT key FROM early_calls ORDER BY id")] == [second]
    assert outcomes == [Outcome.PROCESSED, Outcome.PROCESSED]


async def query_or_hang(event, ctx) -> None:
    """An odd version writes through ctx.db at once; an even one waits on the network for ever."""
    if event.payload["version"] % 2:
        await ctx.db.execute("INSERT INTO early_runs (key, turn_before_query) VALUES ($1, false)", event.key)
    else:
        await asyncio.sleep(3600)


ADVISORY_HELD = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


async def test_a_stop_past_its_grace_mid_handler_leaves_no_early_turn_nor_session_behind(
    tmp_path, claims, pool, monkeypatch
):
    path = tmp_path / "hang.toml"
    path.write_text(
        '[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["s"]\nmax_attempts = 5\nretry_delays = [30]\n'
        'handler = "tests.integration.workers.ordering.test_open_early:query_or_hang"\n'
        '[sources.acme.ordering]\nkey = "body:object"\n'
    )
    sources = load_sources(str(path))
    monkeypatch.setattr(claim_processor, "OPEN_EARLY_SECONDS", 5.0)
    policy = OrderedFailurePolicy(LaneStore(pool), FailurePolicy(None, pool, "unused"))
    processor = Processor(sources, claims, CompletionStore(pool), policy)
    first, _ = await accept(pool, (1, 2))
    runner = LaneRunner(
        LaneStore(pool), processor.run_ordered, sources, set(), "w1", 4, 30_000, lambda *_: None, pages=processor
    )
    runner.offer("acme:a")
    async with asyncio.timeout(10):
        while not await pool.fetchval(ADVISORY_HELD):  # noqa: ASYNC110 - row 2's early turn, polled in pg_locks
            await asyncio.sleep(0.02)
    await runner.stop(0.3)
    assert await pool.fetchval(ADVISORY_HELD) == 0
    assert [row["key"] for row in await pool.fetch("SELECT key FROM processed_events")] == [first]
    assert await pool.fetchval("SELECT count(*) FROM ordered_events") == 1  # row 2 waits, unrun
    async with asyncio.timeout(5):  # every session back in the pool, none in a transaction
        async with pool.acquire() as a, pool.acquire() as b, pool.acquire() as c:
            for connection in (a, b, c):
                assert not connection.is_in_transaction()


async def test_a_handler_that_never_queries_completes_while_the_early_opening_waits_on_a_full_pool(
    tmp_path, database, claims, pool, monkeypatch
):
    """Row 1 queries at once, so row 2's ctx.db opens early; row 2's handler only calls out. The
    transaction pool is full (unordered runs' transactions): opened at its first query, row 2
    would never have asked for a session and completed alone, in a statement of the other pool."""
    path = tmp_path / "mixed.toml"
    path.write_text(
        '[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["s"]\nmax_attempts = 5\nretry_delays = [30]\n'
        'handler = "tests.integration.workers.ordering.test_open_early:query_or_call"\n'
        '[sources.acme.ordering]\nkey = "body:object"\n'
    )
    sources = load_sources(str(path))
    monkeypatch.setattr(claim_processor, "OPEN_EARLY_SECONDS", 5.0)  # row 1's query is soon, however loaded
    LOCKS[:] = [pool]
    await pool.execute(CALLS_TABLE)
    transactions = await asyncpg.create_pool(database, min_size=1, max_size=1)
    try:
        policy = OrderedFailurePolicy(LaneStore(pool), FailurePolicy(None, pool, "unused"))
        processor = Processor(sources, claims, CompletionStore(pool, transactions=transactions), policy)
        await accept(pool, (1,))
        await drain(pool, sources, processor)
        async with transactions.acquire() as held, held.transaction():  # an unordered run's, for seconds
            (second,) = await accept(pool, (2,))
            runner = LaneRunner(
                LaneStore(pool),
                processor.run_ordered,
                sources,
                set(),
                "w1",
                4,
                30_000,
                lambda *_: None,
                pages=processor,
            )
            runner.offer("acme:a")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(3):
                    while runner.held():  # noqa: ASYNC110 - the runner has no event to wait on: polled
                        await asyncio.sleep(0.02)
            done = await pool.fetchval("SELECT count(*) FROM processed_events WHERE key = $1", second)
            await runner.stop(0.1)
        assert done == 1
    finally:
        await transactions.close()
