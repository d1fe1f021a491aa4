"""Ordering keys (docs/design.md, "Ordering keys"), end to
end with real ingress and worker processes: the events of one key's value
(a lane) run one after another in the order they were accepted.

Each asserts the ordering behaviour itself, not only what unordered runs
would also give: without a source's `ordering` the same sends overtake
each other.

Runs are recorded by tests.support.ordering_handlers:record_version: each
run's start through a connection of its own (`version_starts`), its effect
through ctx.db (`version_runs`). A lane's versions sent one after another
begin with one that runs 1 s (`descending`), so that run as they come
(unordered), the next one begins before it ends, every time.
"""

import asyncio
import os
import signal
import time

import aiohttp
import asyncpg
import orjson
import pytest
import redis.asyncio as redis
from click.testing import CliRunner

from tests.conftest import REDIS_URL
from tests.support.broker import amqp_port
from tests.support.ordering_handlers import ORDERING_TABLES
from tests.support.ordering_runs import change_pause, cpu_over, fetch, out_of_order, runs_by_lane, starts_of, until_runs
from tests.support.processes import count_rows, wait_for_output, wait_until
from tests.support.tcpproxy import TcpProxy
from webhook_ingest.cli.main import main
from webhook_ingest.shared import signatures
from webhook_ingest.shared.ordering import BlockedLane, blocked_lanes

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("ordering_tables")]

SECRET = "acme-secret"
HANDLER = "tests.support.ordering_handlers:record_version"


@pytest.fixture
async def ordering_tables(database):
    connection = await asyncpg.connect(database)
    try:
        await connection.execute(ORDERING_TABLES)
    finally:
        await connection.close()


def write_sources(path, database_url: str, ordering: str = "", max_sleep: float = 0.03, handler: str = HANDLER) -> str:
    path.write_text(
        f"""
[sources.acme]
scheme = "hmac-sha256"
secrets = ["{SECRET}"]
handler = "{handler}"
max_attempts = 5
retry_delays = [0.5]
handler_options = {{ database_url = "{database_url}", max_sleep = "{max_sleep}" }}

[sources.acme.ordering]
key = "body:object"
{ordering}
"""
    )
    return str(path)


async def deployment(settings, fleet, tmp_path, ordering: str = "", workers: int = 2, env: dict | None = None, **kw):
    """An ingress and `workers` workers (concurrency 64: more than the lanes in flight) of the ordered
    source acme: (base URL, workers)."""
    sources = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", settings.database_url, ordering, **kw)}
    _, base_url = fleet.ingress(env={**sources, **(env or {})})
    started = [fleet.worker("--concurrency", "64", env={**sources, **(env or {})}) for _ in range(workers)]
    for worker in started:
        await wait_for_output(worker, "worker_consuming")
    await until_ready(base_url)
    return base_url, started


async def until_ready(base_url: str) -> None:
    async def ready() -> bool:
        try:
            async with aiohttp.ClientSession() as session, session.get(f"{base_url}/readyz") as response:
                return response.status == 200
        except aiohttp.ClientError:
            return False

    await wait_until(ready, 60, interval=0.1, message="the ingress ready")


def body(obj: str | None, version: int, **fields) -> bytes:
    document = {"id": f"evt_{obj}_{version}", "type": "test.event", "version": version, **fields}
    if obj is not None:
        document["object"] = obj
    return orjson.dumps(document)


async def post(session: aiohttp.ClientSession, base_url: str, payload: bytes) -> int:
    headers = signatures.sign("hmac-sha256", payload, SECRET) | {"Content-Type": "application/json"}
    async with session.post(f"{base_url}/webhooks/acme", data=payload, headers=headers) as response:
        await response.read()
        return response.status


def descending(obj: str, versions: int) -> list[bytes]:
    """Versions 1..`versions` of one lane: the first runs 1 s, each later one
    10 ms shorter than the one before (the last 10 ms). Run as they come (the
    workers have a free slot for every event in flight), the second begins
    while the first still runs, and later ones overtake earlier ones."""
    return [
        body(obj, version, sleep=1.0 if version == 1 else 0.01 * (versions - version + 1))
        for version in range(1, versions + 1)
    ]


async def send_lane(base_url: str, obj: str | None, versions, **fields) -> list[int]:
    """Each version sent once the previous one was answered: each accepted before the next."""
    async with aiohttp.ClientSession() as session:
        return [await post(session, base_url, body(obj, version, **fields)) for version in versions]


async def send_lanes(base_url: str, lanes: dict[str, list[bytes]]) -> list[int]:
    """Several lanes at once, each one after another."""

    async def one(payloads: list[bytes]) -> list[int]:
        async with aiohttp.ClientSession() as session:
            return [await post(session, base_url, payload) for payload in payloads]

    answers = await asyncio.gather(*(one(payloads) for payloads in lanes.values()))
    return [status for statuses in answers for status in statuses]


# -- A: configuration and intake ------------------------------------------------------


async def test_twenty_versions_of_a_lane_run_in_order_among_fifty_interleaved_lanes(settings, fleet, tmp_path):
    base_url, _ = await deployment(settings, fleet, tmp_path)
    lanes = {f"obj_{n}": descending(f"obj_{n}", 20) for n in range(50)}
    assert set(await send_lanes(base_url, lanes)) == {200}
    await until_runs(settings.database_url, 1000, timeout=120)
    ran = await runs_by_lane(settings.database_url)
    problems = {lane: out_of_order(ran[lane], list(range(1, 21))) for lane in lanes}
    assert {lane: found for lane, found in problems.items() if found} == {}


async def test_a_batch_forms_lanes_run_in_order_among_fifty_interleaved_lanes(settings, fleet, tmp_path):
    """The heads of many lanes share a transaction (BatchProcessor.run_heads)
    and, with a batch form (`handle.batch`), one call: each lane's versions
    still run once each, in order."""
    handler = "tests.support.ordering_handlers:record_version_quickly"
    base_url, _ = await deployment(settings, fleet, tmp_path, handler=handler)
    lanes = {f"obj_{n}": [body(f"obj_{n}", version) for version in range(1, 21)] for n in range(50)}
    assert set(await send_lanes(base_url, lanes)) == {200}
    await until_runs(settings.database_url, 1000, timeout=120)
    ran = await runs_by_lane(settings.database_url)
    problems = {lane: out_of_order(ran[lane], list(range(1, 21))) for lane in lanes}
    assert {lane: found for lane, found in problems.items() if found} == {}
    calls = await fetch(settings.database_url, "SELECT count(*) AS n FROM version_runs GROUP BY pid, started")
    assert max(call["n"] for call in calls) > 1  # heads of several lanes in one call of the batch form


async def test_a_handler_that_forgot_ctx_dead_letters_its_head_instead_of_crashing_its_lane(settings, fleet, tmp_path):
    """A handler whose call raises at once (TypeError: `async def handle(event)`)
    is a failed handler like any other: retried, then a dead letter naming
    the error, which blocks its lane, rather than a lane crashed and taken
    again for ever with its head never settled."""
    handler = "tests.support.ordering_handlers:forgot_ctx"
    base_url, workers = await deployment(settings, fleet, tmp_path, handler=handler)
    assert await send_lane(base_url, "typo", [1, 2]) == [200, 200]
    await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 60, message="a dead letter")
    errors = await fetch(settings.database_url, "SELECT errors::text AS error FROM dead_letters")
    assert "TypeError" in errors[0]["error"]
    assert not any("lane_crashed" in worker.output() for worker in workers)


async def test_a_slow_head_delays_its_own_lane_and_no_other(settings, fleet, tmp_path):
    base_url, _ = await deployment(settings, fleet, tmp_path)
    assert await send_lane(base_url, "slow", [1], sleep=4) == [200]
    assert await send_lane(base_url, "slow", [2], sleep=0) == [200]
    others = {f"obj_{n}": descending(f"obj_{n}", 3) for n in range(10)}
    assert set(await send_lanes(base_url, others)) == {200}
    await until_runs(settings.database_url, 32)
    ran = await runs_by_lane(settings.database_url)
    head_ended = ran["slow"][0]["ended"]
    assert out_of_order(ran["slow"], [1, 2]) == []
    assert [lane for lane in others if ran[lane][-1]["ended"] > head_ended] == []


async def test_an_ordered_source_accepts_and_runs_with_the_broker_stopped(settings, fleet, tmp_path):
    """Its events wait in Postgres, not in the outbox; the workers' watchdog
    finds their lanes with no wake-up."""
    with TcpProxy("127.0.0.1", amqp_port()) as broker_proxy:
        base_url, _ = await deployment(
            settings, fleet, tmp_path, env={"AMQP_URL": broker_proxy.url_for(settings.amqp_url)}
        )
        broker_proxy.cut()
        lanes = {f"obj_{n}": descending(f"obj_{n}", 4) for n in range(5)}
        assert set(await send_lanes(base_url, lanes)) == {200}
        assert await count_rows(settings.database_url, "outbox") == 0
        await until_runs(settings.database_url, 20, timeout=20)
        ran = await runs_by_lane(settings.database_url)
        assert {lane: out_of_order(ran[lane], [1, 2, 3, 4]) for lane in lanes} == {lane: [] for lane in lanes}
        broker_proxy.restore()


async def test_an_event_whose_key_resolves_to_nothing_runs_unordered_and_is_counted(settings, fleet, tmp_path):
    base_url, _ = await deployment(settings, fleet, tmp_path)
    assert await send_lane(base_url, "a", [1, 2, 3]) == [200, 200, 200]
    assert await send_lane(base_url, None, [1, 2]) == [200, 200]  # no `object`: no lane
    await until_runs(settings.database_url, 5)
    lanes = await fetch(settings.database_url, "SELECT lane FROM ordering_keys")
    assert [row["lane"] for row in lanes] == ["acme:a"]
    async with aiohttp.ClientSession() as session, session.get(f"{base_url}/metrics") as response:
        metrics = await response.text()
    assert 'webhook_ordering_unkeyed_total{source="acme"} 2.0' in metrics


# -- B: the runner ------------------------------------------------------------------


async def test_a_failure_retries_in_place_and_its_lane_waits(settings, fleet, tmp_path):
    base_url, _ = await deployment(settings, fleet, tmp_path)
    assert await send_lane(base_url, "a", [1], fail_attempts=1) == [200]
    assert await send_lane(base_url, "a", [2, 3, 4]) == [200, 200, 200]
    await until_runs(settings.database_url, 4)
    ran = await runs_by_lane(settings.database_url)
    assert out_of_order(ran["a"], [1, 2, 3, 4]) == []
    starts = await fetch(settings.database_url, "SELECT version, attempt FROM version_starts ORDER BY started")
    assert [(row["version"], row["attempt"]) for row in starts] == [(1, 1), (1, 2), (2, 1), (3, 1), (4, 1)]


async def test_a_holder_killed_mid_handler_leaves_its_lane_to_another_within_the_lease(settings, fleet, tmp_path):
    """SIGKILL: the lane resumes within the lease's TTL (3 s) + 1.1 s; one effect each, in order."""
    base_url, workers = await deployment(settings, fleet, tmp_path)
    assert await send_lane(base_url, "a", [1], sleep=5) == [200]
    assert await send_lane(base_url, "a", [2, 3, 4, 5], sleep=0) == [200] * 4
    [first] = await starts_of(settings.database_url, 1, count=1)
    holder = next(worker for worker in workers if worker.pid == first["pid"])
    holder.kill()
    killed_at = time.time()
    await until_runs(settings.database_url, 5, timeout=60)
    ran = await runs_by_lane(settings.database_url)
    assert out_of_order(ran["a"], [1, 2, 3, 4, 5]) == []
    [_, again] = await starts_of(settings.database_url, 1, count=2)
    assert again["started"] - killed_at <= settings.lock_ttl + 1.1


@pytest.mark.parametrize("stopped_seconds", [2.5, 3.5], ids=["within-the-lease", "past-the-lease"])
async def test_a_holder_stopped_mid_handler_leaves_the_effects_in_order(settings, fleet, tmp_path, stopped_seconds):
    """SIGSTOP for less and for more than the lease (3 s): ctx.db effects in
    order, once each (a holder woken after its lease ended is fenced)."""
    base_url, _ = await deployment(settings, fleet, tmp_path)
    assert await send_lane(base_url, "a", [1], sleep=1) == [200]
    assert await send_lane(base_url, "a", [2, 3, 4, 5, 6], sleep=0) == [200] * 5
    [first] = await starts_of(settings.database_url, 1, count=1)
    os.kill(first["pid"], signal.SIGSTOP)
    try:
        await asyncio.sleep(stopped_seconds)
    finally:
        os.kill(first["pid"], signal.SIGCONT)
    await until_runs(settings.database_url, 6, timeout=60)
    await asyncio.sleep(2)  # a fenced completion would have shown by now
    ran = await runs_by_lane(settings.database_url)
    assert out_of_order(ran["a"], [1, 2, 3, 4, 5, 6]) == []


async def test_the_namespaces_redis_keys_deleted_mid_stream_change_nothing(settings, fleet, tmp_path):
    """A Redis flush (here: this test's keys only; the machine's Redis is shared)."""
    base_url, _ = await deployment(settings, fleet, tmp_path)
    lanes = {f"obj_{n}": descending(f"obj_{n}", 10) for n in range(10)}
    sending = asyncio.create_task(send_lanes(base_url, lanes))
    await wait_until(lambda: count_rows(settings.database_url, "version_runs"), 30, message="a first effect")
    client = redis.from_url(REDIS_URL)
    try:
        keys = [key async for key in client.scan_iter(match=f"{settings.namespace}:*", count=1000)]
        if keys:
            await client.delete(*keys)
    finally:
        await client.aclose()
    assert set(await sending) == {200}
    await until_runs(settings.database_url, 100)
    ran = await runs_by_lane(settings.database_url)
    assert {lane: out_of_order(ran[lane], list(range(1, 11))) for lane in lanes} == {lane: [] for lane in lanes}


async def test_pause_and_resume_keep_each_lanes_order(settings, fleet, tmp_path):
    base_url, _ = await deployment(settings, fleet, tmp_path)
    await change_pause(settings.database_url, pause=True)
    await asyncio.sleep(1.5)  # a pause reaches every worker within about a second (reference §8.3)
    lanes = {f"obj_{n}": descending(f"obj_{n}", 5) for n in range(10)}
    assert set(await send_lanes(base_url, lanes)) == {200}
    await asyncio.sleep(1)
    assert await count_rows(settings.database_url, "version_starts") == 0
    await change_pause(settings.database_url, pause=False)
    await until_runs(settings.database_url, 50)
    ran = await runs_by_lane(settings.database_url)
    assert {lane: out_of_order(ran[lane], [1, 2, 3, 4, 5]) for lane in lanes} == {lane: [] for lane in lanes}


async def test_versions_sent_in_reverse_within_the_hold_run_in_by_order(settings, fleet, tmp_path):
    base_url, _ = await deployment(settings, fleet, tmp_path, ordering='by = "body:version"\nhold = "2s"')
    assert await send_lane(base_url, "a", [2, 1]) == [200, 200]  # 1 accepted after 2, within 2 s
    await until_runs(settings.database_url, 2)
    ran = await runs_by_lane(settings.database_url)
    assert out_of_order(ran["a"], [1, 2]) == []


async def test_under_stale_skip_an_older_event_completes_unrun_and_is_archived_stale(settings, fleet, tmp_path):
    base_url, _ = await deployment(settings, fleet, tmp_path, ordering='by = "body:version"\nstale = "skip"')
    assert await send_lane(base_url, "a", [2]) == [200]
    await until_runs(settings.database_url, 1)
    assert await send_lane(base_url, "a", [1]) == [200]

    async def archived_status() -> str | None:
        rows = await fetch(settings.database_url, "SELECT status FROM event_archive WHERE key = 'acme:evt_a_1'")
        return rows[0]["status"] if rows and rows[0]["status"] not in ("queued", "retrying") else None

    assert await wait_until(archived_status, 30, interval=0.2, message="version 1 settled") == "stale"
    assert await count_rows(settings.database_url, "processed_events", "key = 'acme:evt_a_1' AND stale") == 1
    assert await count_rows(settings.database_url, "version_starts") == 1  # version 2's only


async def test_a_lane_waiting_on_its_hold_costs_no_cpu_beyond_idle(settings, fleet, tmp_path):
    """One worker; its CPU over 1.8 s idle, then over 1.8 s while an event waits out a 2 s hold."""
    base_url, [worker] = await deployment(
        settings, fleet, tmp_path, ordering='by = "body:version"\nhold = "2s"', workers=1
    )
    await asyncio.sleep(2)  # started up
    idle = await cpu_over(worker.pid, 1.8)
    assert await send_lane(base_url, "a", [1]) == [200]
    holding = await cpu_over(worker.pid, 1.8)
    assert await count_rows(settings.database_url, "version_starts") == 0  # still held
    assert holding <= idle + 0.05, (idle, holding)
    await until_runs(settings.database_url, 1, timeout=10)


# -- C: on-call -------------------------------------------------------------------------
# A dead letter blocks its lane (on_dead_letter = "block"): the lane's later
# events wait until on-call replays it (it runs again first) or discards it.


async def until_blocked(database_url: str, lane: str, not_by: int | None = None, timeout: float = 30) -> BlockedLane:
    """`lane` blocked (by a dead letter other than `not_by`), as `ordering blocked` lists it."""

    async def blocked() -> BlockedLane | None:
        connection = await asyncpg.connect(database_url)
        try:
            found = [b for b in await blocked_lanes(connection, "acme", 100) if b.lane == lane]
        finally:
            await connection.close()
        return found[0] if found and found[0].dead_letter_id != not_by else None

    return await wait_until(blocked, timeout, interval=0.2, message=f"{lane} blocked")


def cli(*args: str):
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 0, result.stderr
    return result.stdout


async def test_a_dead_letter_blocks_its_lane_until_discarded_then_the_rest_run_in_order(settings, fleet, tmp_path):
    base_url, _ = await deployment(settings, fleet, tmp_path)
    assert await send_lane(base_url, "a", [1], fail_attempts=99) == [200]  # dies after max_attempts
    assert await send_lane(base_url, "a", [2, 3]) == [200, 200]
    assert await send_lane(base_url, "b", [1]) == [200]
    blocked = await until_blocked(settings.database_url, "acme:a")
    await until_runs(settings.database_url, 1)
    await asyncio.sleep(1.0)
    assert {
        lane: [run["version"] for run in runs] for lane, runs in (await runs_by_lane(settings.database_url)).items()
    } == {"b": [1]}  # lane a waits behind its dead letter; lane b does not
    assert blocked.waiting == 2
    listed = [
        orjson.loads(line) for line in (await asyncio.to_thread(cli, "ordering", "blocked", "--json")).splitlines()
    ]
    assert [(lane["lane"], lane["dead_letter_id"], lane["waiting"]) for lane in listed] == [
        ("acme:a", blocked.dead_letter_id, 2)
    ]
    assert listed[0]["age_seconds"] >= 0

    await asyncio.to_thread(cli, "dlq", "discard", str(blocked.dead_letter_id))
    await until_runs(settings.database_url, 3)
    assert out_of_order((await runs_by_lane(settings.database_url))["a"], [2, 3]) == []


async def test_a_replayed_dead_letter_runs_again_first_in_its_place(settings, fleet, tmp_path):
    base_url, _ = await deployment(settings, fleet, tmp_path)
    assert await send_lane(base_url, "a", [1], fail_attempts=99) == [200]
    assert await send_lane(base_url, "a", [2, 3]) == [200, 200]
    first = await until_blocked(settings.database_url, "acme:a")
    starts_before = await count_rows(settings.database_url, "version_starts")

    await asyncio.to_thread(cli, "dlq", "replay", str(first.dead_letter_id))
    again = await until_blocked(settings.database_url, "acme:a", not_by=first.dead_letter_id)  # it failed again
    starts = await fetch(settings.database_url, "SELECT version, attempt FROM version_starts ORDER BY started")
    later = [(row["version"], row["attempt"]) for row in starts][starts_before:]
    assert later and all(version == 1 for version, _ in later)  # it ran again, and nothing behind it did
    assert later[0] == (1, 1) and again.waiting == 2
    assert await count_rows(settings.database_url, "version_runs") == 0
