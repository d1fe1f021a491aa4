"""The runner's watchdog (workers/ordering/runner.py, `look`) against the real
Postgres and Redis: which lanes it comes back to when no wake-up will
(a wake-up lost, a retry's delay, a hold)."""

import asyncio
from dataclasses import replace

import pytest

from tests.support.events import make_event
from webhook_ingest.shared.ordering import insert_ordered, ordered_row
from webhook_ingest.shared.sources.model import load_sources
from webhook_ingest.workers.claim import FailurePolicy, Processor
from webhook_ingest.workers.claim.completions import CompletionStore
from webhook_ingest.workers.ordering import LaneRunner, LaneStore, OrderedFailurePolicy

RUNS_TABLE = "CREATE TABLE watchdog_runs (id bigserial PRIMARY KEY, key text NOT NULL)"


async def record(event, ctx) -> None:
    await ctx.db.execute("INSERT INTO watchdog_runs (key) VALUES ($1)", event.key)


@pytest.fixture
def sources(tmp_path):
    """`acme`'s ordered route `audit`; its route `billing` was removed from the file while its lanes held rows."""
    path = tmp_path / "sources.toml"
    path.write_text(
        '[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["s"]\n'
        '[[sources.acme.routes]]\nname = "audit"\n'
        'handler = "tests.integration.workers.ordering.test_watchdog:record"\n'
        'ordering = { key = "body:object" }\n'
    )
    return load_sources(str(path))


async def accept(pool, route: str, obj: str) -> None:
    event = make_event("acme", f"evt_{route}_{obj}", {"object": obj})
    routed = replace(event, key=f"{event.key}#{route}", route=route)
    await insert_ordered(pool, [ordered_row(routed, f"acme#{route}:{obj}", None)])


async def test_lanes_of_a_removed_route_do_not_hide_the_other_lanes_from_the_watchdog(sources, claims, pool):
    """Two lanes of route `billing`, removed from the file, wait (seen in
    `webhook_ordering_unknown_lanes`: a ticket). Then `audit:o1` gets an event
    whose wake-up is lost (the broker blinked; the design's answer is the
    watchdog, within a second). The worker has two slots: each look asks
    Postgres for two lanes, oldest first, gets the two `billing` ones, skips
    them as unknown, and arms nothing: o1 waits as long as `billing`'s lanes
    do. Likewise for a lane let go by a retry or a hold."""
    policy = OrderedFailurePolicy(LaneStore(pool), FailurePolicy(None, pool, "unused"))
    processor = Processor(sources, claims, CompletionStore(pool), policy)
    runner = LaneRunner(
        LaneStore(pool),
        processor.run_ordered,
        sources,
        set(),
        holder="w1",
        capacity=2,
        ttl_ms=30_000,
        settled=lambda _event, _outcome, _started: None,
    )
    await accept(pool, "billing", "x1")
    await accept(pool, "billing", "x2")
    await accept(pool, "audit", "o1")  # its wake-up lost
    watching = asyncio.create_task(runner.watch(0.2))
    try:
        async with asyncio.timeout(5):
            while not await pool.fetchval("SELECT count(*) FROM watchdog_runs"):  # noqa: ASYNC110 - polled
                await asyncio.sleep(0.1)
    except TimeoutError:
        pass
    finally:
        watching.cancel()
        await runner.stop(1)
    runs = [row["key"] for row in await pool.fetch("SELECT key FROM watchdog_runs")]
    assert len(runs) == 1, "audit:o1 not run in 5 s of watchdog rounds: the billing lanes fill every look"
