"""A lane's holder that lost its lane (stopped past its lease while another
worker took the lane over) settling the row it was running, against the
real Postgres and Redis: what its late failure may change in the lane the
new holder runs (docs/design.md, "Ordering keys": a holder that lost its
lane marks nothing)."""

import asyncio
import dataclasses
import datetime
import json

import pytest

from tests.support.events import make_event
from webhook_ingest.shared.event import OrderedStep
from webhook_ingest.shared.ordering import event_of, insert_ordered, ordered_row
from webhook_ingest.shared.sources.model import load_sources
from webhook_ingest.workers.claim import FailurePolicy, Outcome, Processor
from webhook_ingest.workers.claim.completions import CompletionStore
from webhook_ingest.workers.ordering import LaneRunner, LaneStore, OrderedFailurePolicy

RUNS_TABLE = "CREATE TABLE stale_holder_runs (id bigserial PRIMARY KEY, key text NOT NULL)"


async def record(event, ctx) -> None:
    """One row per run (not batchable: each row through Processor.run_ordered)."""
    await ctx.db.execute("INSERT INTO stale_holder_runs (key) VALUES ($1)", event.key)


@pytest.fixture
def sources(tmp_path):
    path = tmp_path / "sources.toml"
    path.write_text(
        '[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["s"]\nmax_attempts = 5\nretry_delays = [30]\n'
        'handler = "tests.integration.workers.ordering.test_stale_holders:record"\n'
        '[sources.acme.ordering]\nkey = "body:object"\n'
    )
    return load_sources(str(path))


@pytest.fixture
def worker(sources, claims, pool):
    """One worker's pieces: its rows' Processor with the ordered failure policy."""
    completions = CompletionStore(pool)
    policy = OrderedFailurePolicy(LaneStore(pool), FailurePolicy(None, pool, "unused"))
    return Processor(sources, claims, completions, policy), completions, policy


async def accept(pool, obj: str, version: int):
    event = make_event("acme", f"evt_{obj}_{version}", {"object": obj, "version": version})
    await insert_ordered(pool, [ordered_row(event, f"acme:{obj}", None)])
    return event


async def lost_head(pool, obj: str):
    """w1 takes the lane with a lease that runs out at once and pages its head:
    the message w1 runs (then stops, SIGSTOP, past its lease)."""
    lane, lanes = f"acme:{obj}", LaneStore(pool)
    taken = await lanes.take(lane, "w1", 1)
    assert taken is not None
    page = await lanes.page(lane, taken.token, 32, 0.0)
    row = page.rows[0]
    step = OrderedStep(lane=lane, seq=row.seq, token=taken.token, by=row.by_value)
    await asyncio.sleep(0.05)  # w1's lease ran out
    return dataclasses.replace(event_of(row.body, row.amqp_headers), ordered=step)


async def w2_runs_the_lane(pool, sources, run, settled=lambda _event, _outcome, _started: None) -> None:
    """w2 takes lane acme:a over and runs it with `run` until it lets it go."""
    runner = LaneRunner(LaneStore(pool), run, sources, set(), holder="w2", capacity=4, ttl_ms=30_000, settled=settled)
    runner.offer("acme:a")
    async with asyncio.timeout(20):
        while runner.held():  # noqa: ASYNC110 - the runner has no event to wait on: polled
            await asyncio.sleep(0.02)


async def test_a_late_retry_of_a_holder_that_lost_its_lane_does_not_lose_the_event(sources, worker, pool):
    """w1 runs e1 attempt 1 and is stopped past its lane lease; w2 takes the
    lane and pages e1 (attempt 1). w1 resumes, its handler's retryable error
    settles as Processor._settle_unfinished does: retry_in_place (unfenced:
    the row moves to attempt 2) then, the outcome RETRIED, record_handed_on
    (attempt 1). w2's run of attempt 1 then finds its attempt handed on:
    DUPLICATE, which the runner reads as "done elsewhere" and `finish`es —
    the row deleted. e1 is never completed, never dead-lettered, its lane
    empty: lost. (w1's settle falling between w2's page and w2's key lease
    is a window of a few ms per takeover; here it is made to fall there.)
    Fenced by the lane's token, w1's retry moves nothing: `deferred`, no
    attempt handed on, and w2's run completes e1."""
    processor, completions, policy = worker
    event = await accept(pool, "a", 1)
    stale = await lost_head(pool, "a")
    settled: list[Outcome] = []

    async def run(message):
        if not settled:  # w1 resumes now, between w2's page and w2's run
            outcome = await policy.fail(stale, sources["acme"], RuntimeError("timed out"))
            if outcome in (Outcome.RETRIED, Outcome.DEAD):  # as Processor._settle_unfinished
                await completions.record_handed_on(stale)
            assert outcome is Outcome.DEFERRED  # not w1's lane: nothing moved, nothing handed on
        return await processor.run_ordered(message)

    await w2_runs_the_lane(pool, sources, run, settled=lambda _event, outcome, _started: settled.append(outcome))
    completed = await pool.fetchval("SELECT count(*) FROM processed_events WHERE key = $1", event.key)
    waiting = await pool.fetchval("SELECT count(*) FROM ordered_events WHERE lane = 'acme:a' AND state = 'pending'")
    dead = await pool.fetchval("SELECT count(*) FROM dead_letters WHERE key = $1", event.key)
    assert (completed, waiting, dead) != (0, 0, 0), f"e1 lost: w2's outcomes {settled}, no row, no completion"


async def test_a_late_retry_of_a_holder_that_lost_its_lane_does_not_delay_the_lanes_next_events(sources, worker, pool):
    """w1 runs e1 and is stopped past its lane lease; w2 takes the lane over
    and completes e1, the lane idle and let go. w1 resumes and its handler
    fails (a call that timed out while it was stopped): retry_in_place finds
    no row to move (e1 is done) but still sets the lane's `ready_at` to its
    retry delay (here 30 s; by default up to 300 s). e2, accepted next, finds
    its lane not takeable until then: its wake-up's take is refused and the
    watchdog leaves it for the delay of a retry that never happened."""
    processor, _, policy = worker
    await accept(pool, "a", 1)
    stale = await lost_head(pool, "a")
    await w2_runs_the_lane(pool, sources, processor.run_ordered)
    assert await pool.fetchval("SELECT count(*) FROM stale_holder_runs") == 1  # e1 done by w2
    assert await policy.fail(stale, sources["acme"], RuntimeError("timed out")) is Outcome.DEFERRED  # w1, late
    await accept(pool, "a", 2)
    taken = await LaneStore(pool).take("acme:a", "w3", 30_000)
    wait = await pool.fetchval("SELECT extract(epoch FROM ready_at - now()) FROM ordering_keys WHERE lane = 'acme:a'")
    assert taken is not None, f"e2's lane not takeable for {wait:.0f} s: w1's late retry set its ready_at"


async def test_a_late_retry_of_a_holder_that_lost_its_lane_leaves_a_pruned_and_remade_lane_alone(sources, worker, pool):
    """w1 runs e1 (seq 1) and is stopped past its lane lease; w2 takes the
    lane over and completes e1; the lane idles past the window and `prune`
    deletes it; e2 is accepted into the lane made anew — seq 1 again. w1
    resumes and its handler fails: retry_in_place(lane, w1's token, seq 1,
    attempt 1) matches e2's row, which moves to attempt 2 carrying e1's
    error (an attempt e2 never ran), and the lane waits w1's retry delay.
    Needs w1 stopped longer than the prune window (30 days by default; as
    long as `--older-than` says)."""
    processor, completions, policy = worker
    await accept(pool, "a", 1)
    stale = await lost_head(pool, "a")
    await w2_runs_the_lane(pool, sources, processor.run_ordered)
    await pool.execute("UPDATE ordering_keys SET updated_at = now() - interval '2 days'")
    await completions.prune(datetime.timedelta(days=1))
    assert await pool.fetchval("SELECT count(*) FROM ordering_keys") == 0  # pruned
    await accept(pool, "a", 2)  # seq 1 of the lane made anew
    assert await policy.fail(stale, sources["acme"], RuntimeError("timed out")) is Outcome.DEFERRED  # w1, late
    row = await pool.fetchrow("SELECT key, seq, attempt, errors FROM ordered_events WHERE lane = 'acme:a'")
    assert (row["seq"], row["attempt"], json.loads(row["errors"])) == (1, 1, []), f"e2's row moved: {dict(row)}"
