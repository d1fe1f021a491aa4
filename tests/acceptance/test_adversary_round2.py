"""Adversary, round 2: the batched acks (a35aea8), the ingress under a
stalled broker (434defa, 7d54713) and the lease holder that cancels its
handler (716d86b), read as an attacker would, against real worker and
ingress processes and the real services. A test marked xfail(strict) is a
finding not fixed yet: it fails on purpose, and the suite says so once it
passes.
"""

import asyncio
import dataclasses
import itertools

import asyncpg
import pytest

from tests.acceptance.test_outbox import event_bodies, merge, post_all, until_ready
from tests.support.events import make_event, publish_events, queue_depth
from tests.support.exactly_once import write_sources
from tests.support.processes import count_rows, wait_for_output, wait_until
from tests.support.tcpproxy import TcpProxy
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.dead_letters.model import record_dead_letter

pytestmark = pytest.mark.usefixtures("effects_tables")
HANDLERS = "tests.support.handlers"


async def _queue_empty(settings) -> bool:
    return await queue_depth(settings.amqp_url, topology.events_queue(settings.namespace)) == 0


async def _execute(database_url: str, sql: str, *args) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(sql, *args)
    finally:
        await connection.close()


async def _settled_somehow(database_url: str, key: str) -> dict:
    """What on-call or the provider could see of the event: completed, or an open dead letter."""
    connection = await asyncpg.connect(database_url)
    try:
        return {
            "completed": await connection.fetchval("SELECT count(*) FROM processed_events WHERE key = $1", key),
            "open_dead_letters": await connection.fetchval(
                "SELECT count(*) FROM dead_letters WHERE key = $1 AND status = 'dead'", key
            ),
        }
    finally:
        await connection.close()


async def _anywhere(database_url: str, key: str) -> bool:
    return any((await _settled_somehow(database_url, key)).values())


async def test_a_retry_waiting_behind_a_stale_copy_of_its_earlier_attempt_is_not_dropped(settings, fleet, tmp_path):
    """Attempt 1 of an event failed and was handed on: its retry (attempt 2)
    is durable and key_fences records attempt 1 as handed on (the state
    `record_handed_on` leaves). A copy of attempt 1 — the provider sending
    the event again, the outbox relay republishing the event whose given-up
    publish the broker confirmed late, a redelivery — reaches the worker
    just before the retry. The copy leads (workers/claim/copies.py), is found
    stale (`attempt_already_handed_on`) and settled DUPLICATE; the retry,
    waiting behind it with the same payload, is then acked as a duplicate
    of it without running. Nothing carries the event on: it must still end
    completed (attempt 2 runs) or as an open dead letter."""
    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", f"{HANDLERS}:counted_inbox")}
    first = make_event("acme", "evt_stale_leader")
    retry = first.next_attempt(
        {"attempt": 1, "at": "2026-11-23T00:00:00+00:00", "type": "RuntimeError", "message": "the receiver was down"}
    )
    await _execute(
        settings.database_url,
        "INSERT INTO key_fences (key, token, replay_of, attempt, payload_sha256) "
        "VALUES ($1, nextval('fencing_tokens'), 0, 1, $2)",
        first.key,
        first.payload_sha256,
    )
    await publish_events(settings.amqp_url, settings.namespace, [first])  # the stale copy, first in the queue
    await publish_events(settings.amqp_url, settings.namespace, [retry])  # the retry, right behind it
    worker = fleet.worker("--concurrency", "8", env=env)
    await wait_for_output(worker, "worker_consuming")
    await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
    await asyncio.sleep(3)  # a deferral would be back within 1 s

    assert "attempt_already_handed_on" in worker.output()  # the stale copy was recognised
    assert await _settled_somehow(settings.database_url, first.key) != {"completed": 0, "open_dead_letters": 0}


async def test_a_replay_waiting_behind_a_stale_copy_of_the_dead_chain_is_not_dropped(settings, fleet, tmp_path):
    """A1 seen from on-call: the event's chain ended in a dead letter after
    attempt 3 (key_fences: chain 0, attempt 3 handed on). The provider sends
    the event once more (chain 0, attempt 1: a copy the design acks as a
    duplicate while the dead letter is open) just as on-call replays the
    dead letter (a new chain, attempt 1). The copy leads, is stale, is
    settled DUPLICATE; the replay waits behind it and is acked as its
    duplicate. The dead letter is `replayed`, so on-call sees nothing left
    to do — the replay must still end completed or as a new open dead letter."""
    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", f"{HANDLERS}:counted_inbox")}
    event = make_event("acme", "evt_replay_behind_stale")
    connection = await asyncpg.connect(settings.database_url)
    try:
        dead_letter_id = await record_dead_letter(
            connection,
            dataclasses.replace(event, attempt=3),
            [
                {"attempt": n, "at": "2026-11-23T00:00:00+00:00", "type": "RuntimeError", "message": "down"}
                for n in (1, 2, 3)
            ],
        )
        await connection.execute(
            "INSERT INTO key_fences (key, token, replay_of, attempt, payload_sha256) "
            "VALUES ($1, nextval('fencing_tokens'), 0, 3, $2)",
            event.key,
            event.payload_sha256,
        )
        await connection.execute("UPDATE dead_letters SET status = 'replayed' WHERE id = $1", dead_letter_id)
    finally:
        await connection.close()
    await publish_events(settings.amqp_url, settings.namespace, [event])  # the provider's copy, chain 0
    await publish_events(settings.amqp_url, settings.namespace, [event.fresh(replay_of=dead_letter_id)])  # the replay
    worker = fleet.worker("--concurrency", "8", env=env)
    await wait_for_output(worker, "worker_consuming")
    await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
    await asyncio.sleep(3)

    assert "attempt_already_handed_on" in worker.output()
    assert await _settled_somehow(settings.database_url, event.key) != {"completed": 0, "open_dead_letters": 0}


async def test_a_retry_waiting_behind_a_deferred_stale_copy_is_not_dropped(settings, fleet, tmp_path):
    """A1 through DEFERRED rather than DUPLICATE: as in the first test,
    attempt 1 was handed on and its retry (attempt 2) arrives right behind
    a stale copy of attempt 1 — but the key's lease is held elsewhere for a
    few seconds (another worker's run of a copy), so the stale copy is
    deferred before it can find out it is stale. Its deferral message
    "carries the event on" for copies.py, and the retry waiting behind it
    is acked; the deferral, back later, is stale (`attempt_already_handed_on`)."""
    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", f"{HANDLERS}:counted_inbox")}
    first = make_event("acme", "evt_deferred_stale_leader")
    retry = first.next_attempt(
        {"attempt": 1, "at": "2026-11-23T00:00:00+00:00", "type": "RuntimeError", "message": "the receiver was down"}
    )
    await _execute(
        settings.database_url,
        "INSERT INTO key_fences (key, token, lease_until, replay_of, attempt, payload_sha256) "
        "VALUES ($1, nextval('fencing_tokens'), clock_timestamp() + interval '4 seconds', 0, 1, $2)",
        first.key,
        first.payload_sha256,
    )
    await publish_events(settings.amqp_url, settings.namespace, [first])
    await publish_events(settings.amqp_url, settings.namespace, [retry])
    worker = fleet.worker("--concurrency", "8", env=env)
    await wait_for_output(worker, "worker_consuming")
    # Either the stale deferral comes back first (attempt_already_handed_on) and
    # the retry then runs, or the retry runs first and the deferral finds it done.
    await wait_until(
        lambda: _anywhere(settings.database_url, first.key), 30, message="the event completed or dead-lettered"
    )
    await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
    await asyncio.sleep(2)

    assert await _settled_somehow(settings.database_url, first.key) != {"completed": 0, "open_dead_letters": 0}
    assert "batch_crashed" not in worker.output()  # a batch whose keys are all leased elsewhere is no crash


async def test_with_postgres_away_a_burst_on_a_healthy_broker_is_answered_200(settings, fleet, tmp_path):
    """Postgres is away for the ingress (a failover, a cut): the broker is the
    one path, and it is healthy, confirming within milliseconds. A provider
    sends bursts of 64 requests at once (its backlog after an outage of its
    own), never more than the ingress's bound of 64 in flight, so the bound
    itself answers no 503. Every request must get 200: the broker takes each
    event (§6: 503 only when neither the broker nor the outbox took it). Since
    434defa a request that finds half the bound (32) waiting for confirms
    makes the broker suspect, wakes the 32 waiting requests and sends them
    and every next request to the outbox — which is away: 503, though the
    broker confirms their publishes a moment later."""
    env = {
        "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", f"{HANDLERS}:counted_inbox"),
        "WEBHOOK_INGEST_MAX_CONCURRENT_REQUESTS": "64",
    }
    with TcpProxy("127.0.0.1", 5432) as postgres:
        postgres.cut()
        ingress, base_url = fleet.ingress(env={**env, "DATABASE_URL": postgres.url_for(settings.database_url)})
        await until_ready(base_url, via="broker")
        statuses: dict[int, int] = {}
        for burst in range(10):
            answered = await post_all(base_url, event_bodies(range(burst * 64, (burst + 1) * 64)), connections=64)
            statuses = merge(statuses, answered)
    queued = await queue_depth(settings.amqp_url, topology.events_queue(settings.namespace))
    assert statuses == {200: 640}, (
        statuses,
        f"{queued} messages on the events queue (no worker runs)",
        [line for line in ingress.output().splitlines() if '"unavailable"' in line][:3],
    )


async def test_a_holder_whose_postgres_path_stalls_cancels_its_handler_and_has_no_run_beside_it(
    settings, fleet, tmp_path
):
    """716d86b against a black hole rather than a cut: the holder's Postgres
    path stalls (connections open, nothing answered), so its renewals get no
    answer at all — neither success nor failure. The timer alone must
    cancel the 5 s external effect before the lease (3 s) can run out, and
    the copy on the other worker must not run beside it, neither while the
    path stalls nor once it flows again (whether the copy runs during the
    stall — the holder's session gone — or after it is not asserted)."""
    sources = write_sources(
        tmp_path / "s.toml",
        "tests.support.adversary_handlers:long_external",
        database_url=settings.database_url,
        seconds=5,
    )
    event = make_event("acme", "evt_black_hole")
    with TcpProxy("127.0.0.1", 5432) as first, TcpProxy("127.0.0.1", 5432) as second:
        proxies = {}
        for proxy in (first, second):
            worker = fleet.worker(
                "--concurrency",
                "1",
                env={"WEBHOOK_INGEST_SOURCES": sources, "DATABASE_URL": proxy.url_for(settings.database_url)},
            )
            proxies[worker.pid] = proxy
        for worker in fleet.processes:
            await wait_for_output(worker, "worker_consuming")
        await publish_events(settings.amqp_url, settings.namespace, [event])
        await wait_until(
            lambda: count_rows(settings.database_url, "runs_started"), 30, interval=0.05, message="the holder's run"
        )
        holder_pid = await _fetchval(settings.database_url, "SELECT pid FROM runs_started LIMIT 1")
        proxies[holder_pid].stall()
        await publish_events(settings.amqp_url, settings.namespace, [event])  # the provider's retry
        await wait_until(
            lambda: count_rows(settings.database_url, "runs"), 30, interval=0.05, message="the holder's run ends"
        )
        holder_run = await _fetchval(settings.database_url, "SELECT ended - started FROM runs LIMIT 1")
        await asyncio.sleep(4)  # the lease ran out long ago; the copy keeps trying
        proxies[holder_pid].flow()
        await wait_until(lambda: count_rows(settings.database_url, "processed_events"), 60, message="a completion")
        await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
        await asyncio.sleep(2)  # a deferred copy comes back after 1 s
    runs = await _fetch(settings.database_url, "SELECT key, pid, started, ended FROM runs ORDER BY started")

    assert holder_run < 3, f"the holder's effect ran {holder_run:.1f} s: not cancelled before its lease ran out"
    assert [(a["pid"], b["pid"]) for a, b in itertools.pairwise(runs) if b["started"] < a["ended"]] == [], runs
    assert await count_rows(settings.database_url, "effects") == 1


async def _fetchval(database_url: str, sql: str, *args):
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetchval(sql, *args)
    finally:
        await connection.close()


async def _fetch(database_url: str, sql: str, *args):
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetch(sql, *args)
    finally:
        await connection.close()
