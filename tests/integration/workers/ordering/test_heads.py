"""Lanes' due heads sharing transactions (BatchProcessor.run_heads, through
the runner's LaneHeads), and lane statements coalesced across lanes
(workers/ordering/coalesced.py), against the real Postgres and Redis:
many lanes in order and once each, in fewer transactions than events; a
lane whose token moved fences its head's completion and the batch goes
alone; a head that brings its page's lease; a stale head completes unrun;
a failing handler undoes the whole batch."""

import asyncio
import dataclasses
import json
from decimal import Decimal

import pytest

from tests.support.events import make_event
from webhook_ingest.shared.event import OrderedStep
from webhook_ingest.shared.ordering import event_of, insert_ordered, ordered_row
from webhook_ingest.shared.sources.model import load_sources
from webhook_ingest.workers.claim import BatchProcessor, Outcome, Processor
from webhook_ingest.workers.claim.completions import CompletionStore
from webhook_ingest.workers.ordering import LaneHeads, LaneRunner, LaneStore

RUNS_TABLE = (
    "CREATE TABLE head_runs (id bigserial PRIMARY KEY, key text NOT NULL, object text NOT NULL,"
    " version int NOT NULL, txid bigint NOT NULL)"
)
FAIL_VERSION = -1


async def record(event, ctx) -> None:
    """One row per run, with its transaction's id: a second run shows as a second row."""
    body = json.loads(event.body)
    if body["version"] == FAIL_VERSION:
        raise RuntimeError("this version fails")
    await ctx.db.execute(
        "INSERT INTO head_runs (key, object, version, txid) VALUES ($1, $2, $3, txid_current())",
        event.key,
        body["object"],
        body["version"],
    )


record.batchable = True


class Failures:
    """Stands in for OrderedFailurePolicy: what was asked, nothing written."""

    def __init__(self):
        self.failed: list[str] = []
        self.delayed: list[str] = []

    async def fail(self, event, source, exc: BaseException) -> Outcome:
        self.failed.append(event.key)
        return Outcome.RETRIED

    async def delay(self, event, delay_seconds: float) -> None:
        self.delayed.append(event.key)


@pytest.fixture
def sources(tmp_path):
    path = tmp_path / "sources.toml"
    path.write_text(
        '[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["s"]\n'
        'handler = "tests.integration.workers.ordering.test_heads:record"\n'
        '[sources.acme.ordering]\nkey = "body:object"\n'
    )
    return load_sources(str(path))


@pytest.fixture
def parts(sources, claims, pool):
    completions = CompletionStore(pool)
    failures = Failures()
    processor = Processor(sources, claims, completions, failures)
    return processor, BatchProcessor(processor, claims, completions), failures


async def accept(pool, obj: str, version: int, by: Decimal | None = None) -> None:
    event = make_event("acme", f"evt_{obj}_{version}", {"object": obj, "version": version})
    await insert_ordered(pool, [ordered_row(event, f"acme:{obj}", by)])


async def head(pool, lanes: LaneStore, obj: str, stale: bool = False):
    """The lane's head as the runner would run it, the lane taken for it."""
    lane = f"acme:{obj}"
    taken = await lanes.take(lane, "w1", 30_000)
    assert taken is not None
    page = await lanes.page(lane, taken.token, 32, 0.0)
    row = page.rows[0]
    step = OrderedStep(lane=lane, seq=row.seq, token=taken.token, by=row.by_value, stale=stale)
    return dataclasses.replace(event_of(row.body, row.amqp_headers), ordered=step)


async def test_many_lanes_run_in_order_once_each_in_fewer_transactions_than_events(sources, parts, pool):
    processor, batches, _ = parts
    objects, versions = [f"obj{n:02d}" for n in range(40)], 3
    for version in range(1, versions + 1):
        for obj in objects:
            await accept(pool, obj, version)
    lanes = LaneStore(pool)
    settled: list[Outcome] = []
    runner = LaneRunner(
        lanes,
        processor.run_ordered,
        sources,
        set(),
        holder="w1",
        capacity=64,
        ttl_ms=30_000,
        settled=lambda _event, outcome, _started: settled.append(outcome),
        pages=processor,
        heads=LaneHeads(batches, processor.batchable),
    )
    for obj in objects:
        runner.offer(f"acme:{obj}")
    async with asyncio.timeout(30):
        while runner.held():  # noqa: ASYNC110 - the runner has no event to wait on: polled
            await asyncio.sleep(0.02)
    rows = await pool.fetch("SELECT key, object, version, txid FROM head_runs ORDER BY id")
    assert len(rows) == len(objects) * versions == len({row["key"] for row in rows})  # once each
    for obj in objects:
        assert [row["version"] for row in rows if row["object"] == obj] == list(range(1, versions + 1))
    assert len({row["txid"] for row in rows}) < len(rows) / 2  # heads of many lanes shared transactions
    assert settled == [Outcome.PROCESSED] * len(rows)
    assert await pool.fetchval("SELECT count(*) FROM ordered_events") == 0
    assert await pool.fetchval("SELECT count(*) FROM ordering_keys WHERE pending <> 0 OR holder IS NOT NULL") == 0
    assert await pool.fetchval("SELECT count(*) FROM key_fences WHERE lease_until IS NOT NULL") == 0


async def test_a_lane_whose_token_moved_fences_its_head_and_the_batch_goes_alone(parts, pool):
    _, batches, _ = parts
    await accept(pool, "a", 1)
    await accept(pool, "b", 1)
    lanes = LaneStore(pool)
    a, b = await head(pool, lanes, "a"), await head(pool, lanes, "b")
    await pool.execute("UPDATE ordering_keys SET token = nextval('fencing_tokens') WHERE lane = 'acme:b'")
    assert await batches.run_heads([(a, None), (b, None)]) == [None, None]  # rolled back: each alone
    assert await pool.fetchval("SELECT count(*) FROM head_runs") == 0
    assert await pool.fetchval("SELECT count(*) FROM processed_events") == 0
    assert await pool.fetchval("SELECT count(*) FROM key_fences WHERE lease_until IS NOT NULL") == 0  # given back
    assert await batches.run_heads([(a, None)]) == [Outcome.PROCESSED]
    assert await pool.fetchval("SELECT pending FROM ordering_keys WHERE lane = 'acme:a'") == 0
    assert await pool.fetchval("SELECT pending FROM ordering_keys WHERE lane = 'acme:b'") == 1


async def test_a_head_brings_its_pages_lease_and_a_stale_head_completes_unrun(parts, pool):
    processor, batches, _ = parts
    await accept(pool, "a", 1)
    await accept(pool, "s", 1)
    lanes = LaneStore(pool)
    a, stale = await head(pool, lanes, "a"), await head(pool, lanes, "s", stale=True)
    leases, completed = await processor.lease_rows([a.key])
    assert completed == {}
    assert await batches.run_heads([(a, leases[a.key]), (stale, None)]) == [Outcome.PROCESSED, Outcome.STALE]
    assert [row["key"] for row in await pool.fetch("SELECT key FROM head_runs")] == [a.key]  # the stale one unrun
    assert await pool.fetchval("SELECT count(*) FROM processed_events WHERE stale") == 1
    assert await pool.fetchval("SELECT count(*) FROM key_fences WHERE lease_until IS NOT NULL") == 0
    assert await pool.fetchval("SELECT count(*) FROM ordered_events") == 0


async def test_a_failing_head_undoes_the_batch_and_a_brought_lease_stays_with_its_lane(parts, pool):
    processor, batches, _ = parts
    await accept(pool, "a", 1)
    await accept(pool, "f", FAIL_VERSION)
    lanes = LaneStore(pool)
    a, failing = await head(pool, lanes, "a"), await head(pool, lanes, "f")
    leases, _ = await processor.lease_rows([a.key])
    assert await batches.run_heads([(a, leases[a.key]), (failing, None)]) == [None, None]
    assert await pool.fetchval("SELECT count(*) FROM head_runs") == 0  # a's run rolled back with the failure
    assert await pool.fetchval("SELECT lease_until IS NOT NULL FROM key_fences WHERE key = $1", a.key)  # still a's
    assert await pool.fetchval("SELECT lease_until IS NULL FROM key_fences WHERE key = $1", failing.key)
    assert await processor.run_leased(a, leases[a.key], None) is Outcome.PROCESSED  # alone, under its lease


async def test_lane_statements_of_many_lanes_answer_each_lane_as_its_own_would(pool):
    for obj in ("a", "b", "c"):
        await accept(pool, obj, 1)
    await accept(pool, "a", 2)
    lanes = LaneStore(pool)
    held = await lanes.take("acme:c", "w2", 30_000)
    assert held is not None
    taken = await lanes.take_many(["acme:a", "acme:b", "acme:c", "acme:none"], "w1", 30_000)
    assert sorted(taken) == ["acme:a", "acme:b"]  # c held elsewhere, none unknown
    pages = await lanes.pages(
        [
            ("acme:a", taken["acme:a"].token, 0.0),
            ("acme:b", taken["acme:b"].token, 60.0),
            ("acme:c", held.token + 1000, 0.0),
        ],
        32,
    )
    assert [row.seq for row in pages["acme:a"].rows] == [1, 2] and pages["acme:a"].ours
    assert pages["acme:b"].due_in is not None and pages["acme:b"].due_in > 50  # its hold not over
    assert not pages["acme:c"].ours  # not our token
    await pool.execute("DELETE FROM ordered_events WHERE lane = 'acme:b'")
    await pool.execute("UPDATE ordering_keys SET pending = 0 WHERE lane = 'acme:b'")
    idle = await lanes.release_many_if_idle([("acme:a", taken["acme:a"].token), ("acme:b", taken["acme:b"].token)])
    assert idle["acme:a"].ours and not idle["acme:a"].released  # rows pending: kept
    assert idle["acme:b"].ours and idle["acme:b"].released
