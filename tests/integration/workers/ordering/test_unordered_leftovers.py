"""A source whose `ordering` was removed from the worker's sources file while
an ingress of the earlier file still writes its events into lanes (a rolling
deploy that restarted the workers first): what the worker's watchdog does
for those lanes, against the real Postgres and Redis (docs/design.md,
"Ordering keys": "Ordering removed: rows already in lanes still drain")."""

import asyncio

import pytest

from tests.support.events import make_event
from webhook_ingest.shared.ordering import insert_ordered, ordered_row
from webhook_ingest.shared.sources.model import load_sources
from webhook_ingest.workers.claim import FailurePolicy, Processor
from webhook_ingest.workers.claim.completions import CompletionStore
from webhook_ingest.workers.ordering import LaneRunner, LaneStore, OrderedFailurePolicy

RUNS_TABLE = "CREATE TABLE leftover_runs (id bigserial PRIMARY KEY, key text NOT NULL, attempt int NOT NULL)"


async def flaky(event, ctx) -> None:
    """Fails its first attempt (a downstream blip), records the next."""
    if event.attempt == 1:
        raise RuntimeError("downstream blip")
    await ctx.db.execute("INSERT INTO leftover_runs (key, attempt) VALUES ($1, $2)", event.key, event.attempt)


@pytest.fixture
def sources(tmp_path):
    """The workers' new file: `acme` no longer ordered."""
    path = tmp_path / "sources.toml"
    path.write_text(
        '[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["s"]\nmax_attempts = 5\nretry_delays = [0.3]\n'
        'handler = "tests.integration.workers.ordering.test_unordered_leftovers:flaky"\n'
    )
    return load_sources(str(path))


async def test_a_lane_of_a_source_no_longer_ordered_resumes_after_a_retry(sources, claims, pool):
    """The worker starts with `acme` unordered and no lane holding rows: its
    first look settles the watchdog's sources to none. An ingress still on the
    earlier file accepts e1 into lane acme:o1 and wakes it; the runner takes
    the wake-up ("whatever the file says") and runs e1, whose first attempt
    fails: retry in place, the lane let go until 0.3 s later. Only the
    watchdog takes a lane back after a retry's delay, and it never looks at
    `acme` again: e1 waits until the worker restarts."""
    policy = OrderedFailurePolicy(LaneStore(pool), FailurePolicy(None, pool, "unused"))
    processor = Processor(sources, claims, CompletionStore(pool), policy)
    runner = LaneRunner(
        LaneStore(pool),
        processor.run_ordered,
        sources,
        set(),
        holder="w1",
        capacity=4,
        ttl_ms=30_000,
        settled=lambda _event, _outcome, _started: None,
    )
    assert await runner.look() == 0  # the first look: nothing waits anywhere
    event = make_event("acme", "evt_1", {"object": "o1"})
    [accepted] = await insert_ordered(pool, [ordered_row(event, "acme:o1", None)])  # the earlier file's ingress
    assert accepted.woke
    runner.offer("acme:o1")  # its wake-up
    deadline = asyncio.get_running_loop().time() + 5
    while asyncio.get_running_loop().time() < deadline:  # the watchdog's rounds, faster
        await runner.look(0.2)
        if await pool.fetchval("SELECT count(*) FROM leftover_runs"):
            break
        await asyncio.sleep(0.2)
    lane = await pool.fetchrow("SELECT pending, ready_at < now() AS due FROM ordering_keys WHERE lane = 'acme:o1'")
    runs = await pool.fetch("SELECT attempt FROM leftover_runs")
    assert [run["attempt"] for run in runs] == [2], f"e1's attempt 2 never ran in 5 s; its lane {dict(lane)}"
