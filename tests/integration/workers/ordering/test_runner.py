"""The runner end to end with real worker processes, fed as the ingress of
package A will feed them but without it: each event is inserted into its
lane (`insert_ordered`, one commit each: each accepted before the next) and
a wake-up published when the lane went idle -> busy. What the acceptance
tests of package B (tests/acceptance/test_ordering.py) check through the
ingress: order among lanes, a slow head, retries in place, a holder killed
or stopped mid-handler, Redis keys deleted, pause/resume, hold, stale, and
a hold costing no CPU."""

import asyncio
import os
import signal
import time
from collections import defaultdict
from dataclasses import replace
from decimal import Decimal

import aio_pika
import asyncpg
import pytest
import redis.asyncio as redis

from tests.acceptance.test_ordering import _change_pause, _cpu_over, out_of_order
from tests.conftest import REDIS_URL
from tests.support.events import make_event
from tests.support.ordering_handlers import ORDERING_TABLES
from tests.support.processes import count_rows, wait_for_output, wait_until
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.ordering import insert_ordered, ordered_row

pytestmark = [pytest.mark.slow]

HANDLER = "tests.support.ordering_handlers:record_version"


@pytest.fixture
async def tables(database):
    connection = await asyncpg.connect(database)
    try:
        await connection.execute(ORDERING_TABLES)
    finally:
        await connection.close()


def write_sources(path, database_url: str, ordering: str = "") -> str:
    path.write_text(
        f"""
[sources.acme]
scheme = "hmac-sha256"
secrets = ["s"]
handler = "{HANDLER}"
max_attempts = 5
retry_delays = [0.5]
handler_options = {{ database_url = "{database_url}", max_sleep = "0.03" }}

[sources.acme.ordering]
key = "body:object"
{ordering}
"""
    )
    return str(path)


async def workers(settings, fleet, tmp_path, ordering: str = "", count: int = 2):
    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", settings.database_url, ordering)}
    started = [fleet.worker("--concurrency", "64", env=env) for _ in range(count)]
    for worker in started:
        await wait_for_output(worker, "worker_consuming")
    return started


class Feeder:
    """Accepts events into their lanes as the ingress would: one commit each, a wake-up when one goes busy."""

    def __init__(self, settings):
        self._settings = settings

    async def __aenter__(self):
        self._db = await asyncpg.create_pool(self._settings.database_url, min_size=1, max_size=4)
        self._broker = await aio_pika.connect(self._settings.amqp_url)
        self._channel = await self._broker.channel(publisher_confirms=True)
        await topology.declare_ordering_queue(self._channel, self._settings.namespace)
        return self

    async def __aexit__(self, *exc):
        await self._broker.close()
        await self._db.close()

    async def send(self, obj: str, version: int, by: bool = False, **fields) -> None:
        event = make_event("acme", f"evt_{obj}_{version}", {"object": obj, "version": version, **fields})
        [accepted] = await insert_ordered(
            self._db, [ordered_row(event, f"acme:{obj}", Decimal(version) if by else None)]
        )
        if accepted.woke:
            await topology.publish_wake(self._channel, self._settings.namespace, accepted.lane)

    async def lane(self, obj: str, versions, **fields) -> None:
        for version in versions:
            await self.send(obj, version, **fields)


def descending(versions: int) -> list[tuple[int, float]]:
    return [(v, 1.0 if v == 1 else 0.01 * (versions - v + 1)) for v in range(1, versions + 1)]


async def send_lanes(settings, lanes: dict[str, list[tuple[int, float]]]) -> None:
    """Several lanes at once, each one after another (a few connections: the ingress's pool)."""
    async with Feeder(settings) as feeder:

        async def one(obj: str, versions) -> None:
            for version, sleep in versions:
                await feeder.send(obj, version, sleep=sleep)

        await asyncio.gather(*(one(obj, versions) for obj, versions in lanes.items()))


async def fetch(database_url: str, sql: str, *args) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetch(sql, *args)
    finally:
        await connection.close()


async def runs_by_lane(database_url: str) -> dict[str, list[asyncpg.Record]]:
    lanes: dict[str, list[asyncpg.Record]] = defaultdict(list)
    for run in await fetch(database_url, "SELECT * FROM version_runs ORDER BY started"):
        lanes[run["object"]].append(run)
    return lanes


async def until_runs(database_url: str, count: int, timeout: float = 60) -> None:
    async def done() -> bool:
        return await count_rows(database_url, "version_runs") >= count

    await wait_until(done, timeout, interval=0.1, message=f"{count} effects")


async def starts_of(database_url: str, version: int, count: int) -> list[asyncpg.Record]:
    async def started():
        rows = await fetch(
            database_url,
            "SELECT pid, started FROM version_starts WHERE object = 'a' AND version = $1 ORDER BY started",
            version,
        )
        return rows[:count] if len(rows) >= count else None

    return list(await wait_until(started, 60, message=f"{count} starts of version {version}"))


async def test_fifty_lanes_of_twenty_versions_run_in_order(settings, fleet, tmp_path, tables):
    await workers(settings, fleet, tmp_path)
    lanes = {f"obj_{n}": descending(20) for n in range(50)}
    await send_lanes(settings, lanes)
    await until_runs(settings.database_url, 1000, timeout=120)
    ran = await runs_by_lane(settings.database_url)
    problems = {lane: out_of_order(ran[lane], list(range(1, 21))) for lane in lanes}
    assert {lane: found for lane, found in problems.items() if found} == {}
    assert await count_rows(settings.database_url, "ordered_events") == 0
    assert await count_rows(settings.database_url, "ordering_keys", "pending <> 0") == 0


async def test_a_slow_head_delays_its_own_lane_and_no_other(settings, fleet, tmp_path, tables):
    await workers(settings, fleet, tmp_path)
    async with Feeder(settings) as feeder:
        await feeder.send("slow", 1, sleep=4)
        await feeder.send("slow", 2, sleep=0)
    await send_lanes(settings, {f"obj_{n}": descending(3) for n in range(10)})
    await until_runs(settings.database_url, 32)
    ran = await runs_by_lane(settings.database_url)
    head_ended = ran["slow"][0]["ended"]
    assert out_of_order(ran["slow"], [1, 2]) == []
    assert [lane for lane in ran if lane != "slow" and ran[lane][-1]["ended"] > head_ended] == []


async def test_a_failure_retries_in_place_and_its_lane_waits(settings, fleet, tmp_path, tables):
    await workers(settings, fleet, tmp_path)
    async with Feeder(settings) as feeder:
        await feeder.send("a", 1, fail_attempts=1)
        await feeder.lane("a", [2, 3, 4])
    await until_runs(settings.database_url, 4)
    ran = await runs_by_lane(settings.database_url)
    assert out_of_order(ran["a"], [1, 2, 3, 4]) == []
    starts = await fetch(settings.database_url, "SELECT version, attempt FROM version_starts ORDER BY started")
    assert [(row["version"], row["attempt"]) for row in starts] == [(1, 1), (1, 2), (2, 1), (3, 1), (4, 1)]


async def test_a_dead_letter_blocks_its_lane(settings, fleet, tmp_path, tables):
    await workers(settings, fleet, tmp_path, count=1)
    async with Feeder(settings) as feeder:
        await feeder.send("a", 1, fail_attempts=99)
        await feeder.lane("a", [2, 3])
    await wait_until(
        lambda: count_rows(settings.database_url, "ordering_keys", "blocked_by IS NOT NULL"), 30, message="blocked"
    )
    [lane] = await fetch(settings.database_url, "SELECT pending, blocked_by, holder FROM ordering_keys")
    assert (lane["pending"], lane["holder"]) == (2, None)
    [dead] = await fetch(settings.database_url, "SELECT id, key FROM dead_letters")
    assert (dead["id"], dead["key"]) == (lane["blocked_by"], "acme:evt_a_1")
    await asyncio.sleep(1)
    assert await count_rows(settings.database_url, "version_runs") == 0


async def test_a_holder_killed_mid_handler_leaves_its_lane_to_another_within_the_lease(
    settings, fleet, tmp_path, tables
):
    started = await workers(settings, fleet, tmp_path)
    async with Feeder(settings) as feeder:
        await feeder.send("a", 1, sleep=5)
        await feeder.lane("a", [2, 3, 4, 5], sleep=0)
    [first] = await starts_of(settings.database_url, 1, count=1)
    holder = next(worker for worker in started if worker.pid == first["pid"])
    holder.kill()
    killed_at = time.time()
    await until_runs(settings.database_url, 5, timeout=60)
    ran = await runs_by_lane(settings.database_url)
    assert out_of_order(ran["a"], [1, 2, 3, 4, 5]) == []
    [_, again] = await starts_of(settings.database_url, 1, count=2)
    assert again["started"] - killed_at <= settings.lock_ttl + 1.1


@pytest.mark.parametrize("stopped_seconds", [2.5, 3.5], ids=["within-the-lease", "past-the-lease"])
async def test_a_holder_stopped_mid_handler_leaves_the_effects_in_order(
    settings, fleet, tmp_path, tables, stopped_seconds
):
    await workers(settings, fleet, tmp_path)
    async with Feeder(settings) as feeder:
        await feeder.send("a", 1, sleep=1)
        await feeder.lane("a", [2, 3, 4, 5, 6], sleep=0)
    [first] = await starts_of(settings.database_url, 1, count=1)
    os.kill(first["pid"], signal.SIGSTOP)
    try:
        await asyncio.sleep(stopped_seconds)
    finally:
        os.kill(first["pid"], signal.SIGCONT)
    await until_runs(settings.database_url, 6, timeout=60)
    await asyncio.sleep(2)
    ran = await runs_by_lane(settings.database_url)
    assert out_of_order(ran["a"], [1, 2, 3, 4, 5, 6]) == []


async def test_the_namespaces_redis_keys_deleted_mid_stream_change_nothing(settings, fleet, tmp_path, tables):
    await workers(settings, fleet, tmp_path)
    sending = asyncio.create_task(send_lanes(settings, {f"obj_{n}": descending(10) for n in range(10)}))
    await wait_until(lambda: count_rows(settings.database_url, "version_runs"), 30, message="a first effect")
    client = redis.from_url(REDIS_URL)
    try:
        keys = [key async for key in client.scan_iter(match=f"{settings.namespace}:*", count=1000)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()
    await sending
    await until_runs(settings.database_url, 100)
    ran = await runs_by_lane(settings.database_url)
    assert {lane: out_of_order(runs, list(range(1, 11))) for lane, runs in ran.items()} == {
        f"obj_{n}": [] for n in range(10)
    }


async def test_pause_and_resume_keep_each_lanes_order(settings, fleet, tmp_path, tables):
    await workers(settings, fleet, tmp_path)
    await _change_pause(settings.database_url, pause=True)
    await asyncio.sleep(1.5)
    await send_lanes(settings, {f"obj_{n}": descending(5) for n in range(10)})
    await asyncio.sleep(1)
    assert await count_rows(settings.database_url, "version_starts") == 0
    await _change_pause(settings.database_url, pause=False)
    await until_runs(settings.database_url, 50)
    ran = await runs_by_lane(settings.database_url)
    assert {lane: out_of_order(runs, [1, 2, 3, 4, 5]) for lane, runs in ran.items()} == {
        f"obj_{n}": [] for n in range(10)
    }


async def test_versions_sent_in_reverse_within_the_hold_run_in_by_order(settings, fleet, tmp_path, tables):
    await workers(settings, fleet, tmp_path, ordering='by = "body:version"\nhold = "2s"')
    async with Feeder(settings) as feeder:
        await feeder.send("a", 2, by=True)
        await feeder.send("a", 1, by=True)
    await until_runs(settings.database_url, 2)
    ran = await runs_by_lane(settings.database_url)
    assert out_of_order(ran["a"], [1, 2]) == []


async def test_under_stale_skip_an_older_event_completes_unrun(settings, fleet, tmp_path, tables):
    await workers(settings, fleet, tmp_path, ordering='by = "body:version"\nstale = "skip"')
    async with Feeder(settings) as feeder:
        await feeder.send("a", 2, by=True)
        await until_runs(settings.database_url, 1)
        await feeder.send("a", 1, by=True)

    async def completed() -> int:
        return await count_rows(settings.database_url, "processed_events", "key = 'acme:evt_a_1' AND stale")

    await wait_until(completed, 30, interval=0.2, message="version 1 completed stale")
    assert await count_rows(settings.database_url, "version_starts", "version = 1") == 0  # never ran
    assert await count_rows(settings.database_url, "version_runs", "version = 2") == 1
    assert await count_rows(settings.database_url, "ordered_events") == 0


async def test_a_lane_waiting_on_its_hold_costs_no_cpu_beyond_idle(settings, fleet, tmp_path, tables):
    [worker] = await workers(settings, fleet, tmp_path, ordering='by = "body:version"\nhold = "2s"', count=1)
    await asyncio.sleep(2)
    idle = await _cpu_over(worker.pid, 1.8)
    async with Feeder(settings) as feeder:
        await feeder.send("a", 1, by=True)
    holding = await _cpu_over(worker.pid, 1.8)
    assert await count_rows(settings.database_url, "version_starts") == 0  # still held
    assert holding <= idle + 0.05, (idle, holding)
    await until_runs(settings.database_url, 1, timeout=10)


async def test_a_burst_over_more_lanes_than_the_concurrency_runs_without_waiting_on_the_watchdog(
    settings, fleet, tmp_path, tables
):
    """Forty lanes of one short event each, accepted at once, on a worker of
    --concurrency 4: run unordered, ~0.1 s of handlers. Most lanes' wake-ups
    reach the worker while its four slots are busy; each slot that frees up
    must look for them at once, not leave them to the watchdog's next round
    (1 s, at most the free slots: ~4 lanes a second, ~10 s for the burst)."""
    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", settings.database_url)}
    worker = fleet.worker("--concurrency", "4", env=env)
    await wait_for_output(worker, "worker_consuming")
    async with Feeder(settings) as feeder:
        sent = time.time()
        await asyncio.gather(*(feeder.send(f"obj_{n}", 1, sleep=0.01) for n in range(40)))
    await until_runs(settings.database_url, 40, timeout=60)
    [last] = await fetch(settings.database_url, "SELECT max(ended) AS ended FROM version_runs")
    assert last["ended"] - sent < 3.0, f"40 lanes of one 10 ms event took {last['ended'] - sent:.1f} s"


async def test_a_lane_of_a_route_the_worker_does_not_know_is_not_run_in_a_crash_loop(settings, fleet, tmp_path, tables):
    """Rows wait in `acme#billing:o1`; the sources file has no route
    `billing` (removed while its lane held rows, or not in this worker's
    file yet). A message for such a route waits in a delay queue, then is a
    dead letter after UNKNOWN_SOURCE_PATIENCE (worker._unknown_source). The
    runner offers the lane (its source is known), takes it and runs the row:
    Processor.call_handler's handler_for raises KeyError, not a handler's
    failure, so `lane_crashed` (a stack trace), the lane released (no
    delivery counted), and the watchdog takes it again a second later."""
    path = tmp_path / "s.toml"
    path.write_text(
        f"""
[sources.acme]
scheme = "hmac-sha256"
secrets = ["s"]

[[sources.acme.routes]]
name = "audit"
handler = "{HANDLER}"
handler_options = {{ database_url = "{settings.database_url}" }}
ordering = {{ key = "body:object" }}
"""
    )
    event = make_event("acme", "evt_b1", {"object": "o1", "version": 1})
    routed = replace(event, key=f"{event.key}#billing", route="billing")
    connection = await asyncpg.connect(settings.database_url)
    try:
        await insert_ordered(connection, [ordered_row(routed, "acme#billing:o1", None)])
    finally:
        await connection.close()
    worker = fleet.worker("--concurrency", "4", env={"WEBHOOK_INGEST_SOURCES": str(path)})
    await wait_for_output(worker, "worker_consuming")
    await asyncio.sleep(4)
    crashes = worker.output().count("lane_crashed")
    assert crashes <= 1, f"{crashes} lane_crashed in 4 s"
