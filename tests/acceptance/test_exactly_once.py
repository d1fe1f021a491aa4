"""Exactly-once effect (docs/reference.md §7.1) with real worker processes: copies
racing across processes, a worker killed with SIGKILL, Redis flushed or
unreachable, Postgres cut, a paused lock holder, a graceful stop; another
payload after a retried completion is a conflict, and a resend after prune
forgot the key is processed again.

Handlers come from tests.support.handlers; most write a row to `effects`,
which has no unique key, so a second run of one event is a second row.
"""

import asyncio
import os
import signal
import sys

import aio_pika
import aiohttp
import asyncpg
import orjson
import pytest
import redis.asyncio as redis

from tests.support.events import make_event, publish_events, queue_depth
from tests.support.exactly_once import (
    SECRET,
    assert_each_once,
    effects_by_key,
    metered_worker,
    recorded_runs,
    until_completed,
    until_every_message_handled,
    write_sources,
)
from tests.support.outcomes import fetchrow as _fetchrow
from tests.support.outcomes import settled_quietly as _settled_quietly
from tests.support.outcomes import where_is as _where_is
from tests.support.processes import count_rows, outcomes, wait_for_output, wait_until
from tests.support.redis_server import RedisServer
from tests.support.tcpproxy import TcpProxy, free_port
from webhook_ingest.shared import signatures
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.redis_keys import DONE_PREFIX, key_prefix

pytestmark = pytest.mark.usefixtures("effects_tables")
HANDLERS = "tests.support.handlers"


async def test_copies_sent_concurrently_through_the_ingress_complete_once(settings, fleet, tmp_path):
    """400 events × 5 copies posted at once; 3 workers race for them."""
    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", "tests.support.handlers:counted_inbox")}
    _, base_url = fleet.ingress(env=env)
    workers = [metered_worker(fleet, env, "--concurrency", "32") for _ in range(3)]
    for worker, _ in workers:
        await wait_for_output(worker, "worker_consuming")

    events = [orjson.dumps({"id": f"evt_{n}", "type": "test.event", "pad": "x" * 200}) for n in range(400)]
    answers = await post_concurrently(base_url, [body for body in events for _ in range(5)])
    assert sum(answers.values()) == 2000 and set(answers) <= {"accepted", "duplicate"}, answers

    # a copy the ingress answered from the done marker was never queued
    await until_every_message_handled([url for _, url in workers], answers["accepted"])
    runs = await effects_by_key(settings.database_url)
    assert runs == {f"acme:evt_{n}": 1 for n in range(400)}
    assert await count_rows(settings.database_url, "inbox") == 400
    assert await count_rows(settings.database_url, "dead_letters") == 0


async def test_three_event_queues_a_fleet_runs_each_event_once_a_worker_killed(settings, fleet, tmp_path):
    """WEBHOOK_INGEST_EVENT_QUEUES=3: the ingress puts each event on its key's
    partition, every worker consumes all three; 300 events × 3 copies posted
    at once, one of 3 workers SIGKILLed a third of the way, a replacement
    started: each event runs once, and every partition ends empty."""
    env = {
        "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", "tests.support.handlers:slow_inbox"),
        "WEBHOOK_INGEST_EVENT_QUEUES": "3",
    }
    _, base_url = fleet.ingress(env=env)
    victim, *others = [fleet.worker("--concurrency", "16", env=env) for _ in range(3)]
    partitions = [f"{settings.namespace}.events.{n}" for n in range(3)]
    for worker in (victim, *others):
        await wait_for_output(worker, "worker_consuming")
        assert ",".join(partitions) in worker.output()

    bodies = [orjson.dumps({"id": f"evt_{n}", "type": "test.event"}) for n in range(300)]

    async def kill_a_third_of_the_way() -> None:
        await until_completed(settings.database_url, 100)
        victim.kill()
        fleet.worker("--concurrency", "16", env=env)

    answers, _ = await asyncio.gather(
        post_concurrently(base_url, [body for body in bodies for _ in range(3)]), kill_a_third_of_the_way()
    )
    assert sum(answers.values()) == 900 and set(answers) <= {"accepted", "duplicate"}, answers

    await until_completed(settings.database_url, 300)

    async def partitions_empty() -> bool:
        return all([await queue_depth(settings.amqp_url, name) == 0 for name in partitions])

    await wait_until(partitions_empty, 30, message="every partition empty")
    await asyncio.sleep(1)  # any redelivered copy of the victim's messages would show by now
    assert await effects_by_key(settings.database_url) == {f"acme:evt_{n}": 1 for n in range(300)}
    assert await count_rows(settings.database_url, "inbox") == 300
    assert await count_rows(settings.database_url, "dead_letters") == 0
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):  # nothing was ever put on NS.events
            await (await connection.channel()).declare_queue(topology.events_queue(settings.namespace), passive=True)


async def post_concurrently(base_url: str, bodies: list[bytes], connections: int = 64) -> dict[str, int]:
    """How many answers of each kind: "accepted", "duplicate", or "HTTP <code>"."""
    await _wait_ready(base_url)
    limit = asyncio.Semaphore(connections)
    answers: dict[str, int] = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections)) as session:

        async def post(body: bytes) -> None:
            headers = signatures.sign("hmac-sha256", body, SECRET) | {"Content-Type": "application/json"}
            async with limit, session.post(f"{base_url}/webhooks/acme", data=body, headers=headers) as response:
                answer = (await response.json())["status"] if response.status == 200 else f"HTTP {response.status}"
                answers[answer] = answers.get(answer, 0) + 1

        await asyncio.gather(*(post(body) for body in bodies))
    return answers


async def _wait_ready(base_url: str) -> None:
    async def ready() -> bool:
        try:
            async with aiohttp.ClientSession() as session, session.get(f"{base_url}/readyz") as response:
                return response.status == 200
        except aiohttp.ClientError:
            return False

    await wait_until(ready, 30, interval=0.1, message="the ingress ready")


async def test_a_worker_killed_mid_run_loses_nothing_and_repeats_nothing(settings, fleet, tmp_path):
    """SIGKILL one of 2 workers a third of the way through 1,000 events with
    a 20–50 ms handler; a replacement starts; all complete exactly once."""
    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", "tests.support.handlers:slow_inbox")}
    events = [make_event("acme", f"evt_{n}") for n in range(1000)]
    await publish_events(settings.amqp_url, settings.namespace, events)
    victim = fleet.worker("--concurrency", "16", env=env)
    fleet.worker("--concurrency", "16", env=env)

    await until_completed(settings.database_url, 333)
    victim.kill()
    assert await count_rows(settings.database_url, "processed_events") < 1000  # killed mid-run
    fleet.worker("--concurrency", "16", env=env)

    await until_completed(settings.database_url, 1000)
    await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
    await asyncio.sleep(1)  # any redelivered copy of the victim's messages would show by now
    await assert_each_once(settings.database_url, events)


async def _queue_empty(settings) -> bool:
    return await queue_depth(settings.amqp_url, topology.events_queue(settings.namespace)) == 0


async def test_redis_flushed_mid_run_then_every_event_resent_runs_nothing_twice(settings, fleet, tmp_path):
    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", "tests.support.handlers:slow_inbox")}
    events = [make_event("acme", f"evt_{n}") for n in range(400)]
    with RedisServer() as redis_server:
        env["REDIS_URLS"] = redis_server.url
        workers = [metered_worker(fleet, env, "--concurrency", "16") for _ in range(2)]
        await publish_events(settings.amqp_url, settings.namespace, events)

        await until_completed(settings.database_url, 150)
        flushed = await asyncio.create_subprocess_exec("redis-cli", "-p", str(redis_server.port), "FLUSHALL")
        assert await flushed.wait() == 0
        assert await count_rows(settings.database_url, "processed_events") < 400  # mid-run
        await until_completed(settings.database_url, 400)
        await publish_events(settings.amqp_url, settings.namespace, events)  # every event again

        await until_every_message_handled([url for _, url in workers], 800)
        counts = await outcomes([url for _, url in workers])
    assert counts.get("processed") == 400 and counts.get("duplicate") == 400
    await assert_each_once(settings.database_url, events)


async def test_redis_unreachable_from_the_start_duplicates_across_workers_run_once(settings, fleet, tmp_path):
    """Degraded mode: Postgres alone (advisory lock + unique completion) keeps exactly once."""
    env = {
        "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", "tests.support.handlers:slow_inbox"),
        "REDIS_URLS": f"redis://127.0.0.1:{free_port()}/0",
    }  # nothing listens there
    events = [make_event("acme", f"evt_{n}") for n in range(200)]
    workers = [metered_worker(fleet, env, "--concurrency", "16") for _ in range(2)]
    await publish_events(settings.amqp_url, settings.namespace, [e for e in events for _ in range(3)])

    await until_every_message_handled([url for _, url in workers], 600)
    await assert_each_once(settings.database_url, events)
    assert all("idempotency_store_degraded" in worker.output() for worker, _ in workers)


async def test_postgres_cut_mid_run_costs_no_attempt_and_repeats_nothing(settings, fleet, tmp_path):
    events = [make_event("acme", f"evt_{n}") for n in range(600)]
    with TcpProxy("127.0.0.1", 5432) as postgres:
        env = {
            "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", "tests.support.handlers:slow_inbox"),
            "DATABASE_URL": postgres.url_for(settings.database_url),
        }
        workers = [fleet.worker("--concurrency", "16", env=env) for _ in range(2)]
        await publish_events(settings.amqp_url, settings.namespace, events)

        await until_completed(settings.database_url, 200)
        postgres.cut()
        await asyncio.sleep(3)
        postgres.restore()
        await until_completed(settings.database_url, 600)
        await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
        await asyncio.sleep(1)

    await assert_each_once(settings.database_url, events)
    assert await _attempts(settings.database_url) == {1}  # the outage used no attempt
    assert any("service_outage" in worker.output() for worker in workers)


async def _attempts(database_url: str) -> set[int]:
    connection = await asyncpg.connect(database_url)
    try:
        return {row["attempts"] for row in await connection.fetch("SELECT DISTINCT attempts FROM processed_events")}
    finally:
        await connection.close()


async def test_an_external_effect_sent_ten_times_to_three_workers_never_overlaps(settings, fleet, tmp_path):
    """The handler's side effect goes through its own connection (like an
    HTTP call): only the processing lock keeps two runs apart."""
    env = {
        "WEBHOOK_INGEST_SOURCES": write_sources(
            tmp_path / "s.toml", "tests.support.handlers:external_effect", database_url=settings.database_url
        )
    }
    workers = [fleet.worker("--concurrency", "8", env=env) for _ in range(3)]
    for worker in workers:
        await wait_for_output(worker, "worker_consuming")
    event = make_event("acme", "evt_external")
    await publish_events(settings.amqp_url, settings.namespace, [event] * 10)

    await until_completed(settings.database_url, 1)
    await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
    await asyncio.sleep(2)  # a deferred copy comes back after 1 s: let every one finish
    runs = await recorded_runs(settings.database_url)
    assert len(runs) == 1, runs
    assert await count_rows(settings.database_url, "inbox") == 1


async def test_a_lock_holder_paused_past_its_ttl_keeps_its_turn_and_nothing_runs_beside_it(settings, fleet, tmp_path):
    """The first holder blocks its process for 4 s with a 1 s lock TTL; the
    other worker wins the expired Redis lock but not the key's turn in
    Postgres, so it never starts the handler while the holder runs. The
    holder, waking past its lease with the key taken meanwhile, does not
    complete either: the event runs again later, once (issue 10, item 1).
    Since issue 35 it asks Postgres on waking rather than giving up on its
    own clock; its handler's next query comes first here, and the fence
    refuses its completion (the answer, "not ours", would cancel it)."""
    env = {
        "WEBHOOK_INGEST_SOURCES": write_sources(
            tmp_path / "s.toml",
            "tests.support.handlers:paused_holder",
            database_url=settings.database_url,
            pause_seconds=4,
            takeover_seconds=1,
        ),
        "WEBHOOK_INGEST_LOCK_TTL": "1",
    }
    workers = [fleet.worker("--concurrency", "1", env=env) for _ in range(2)]  # one message each
    for worker in workers:
        await wait_for_output(worker, "worker_consuming")
    event = make_event("acme", "evt_paused")
    await publish_events(settings.amqp_url, settings.namespace, [event])
    await wait_until(lambda: count_rows(settings.database_url, "runs_started"), 30, message="the first run")
    await publish_events(settings.amqp_url, settings.namespace, [event])  # goes to the other worker

    await until_completed(settings.database_url, 1, timeout=60)
    await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
    connection = await asyncpg.connect(settings.database_url)
    try:
        paused_pid = await connection.fetchval("SELECT pid FROM runs_started ORDER BY ctid LIMIT 1")
        effects = await connection.fetchval("SELECT count(*) FROM effects")
    finally:
        await connection.close()
    paused, successor = sorted(workers, key=lambda worker: worker.pid != paused_pid)
    assert effects == 1
    assert '"reason":"TurnTaken"' in successor.output()  # it waited for the turn instead of running
    assert '"reason":"CompletionRefused"' in paused.output() or '"reason":"LockLost"' in paused.output()


async def test_a_batch_form_paused_past_its_leases_while_copies_run_elsewhere_completes_each_once(
    settings, fleet, tmp_path
):
    """A batch form (`handle.batch`) writes its events' rows, then blocks its
    process past its 1 s TTL; copies of those events go to a second worker,
    which takes some of their leases meanwhile and meets the paused batch's
    turns (the pause ends then: a worker's start is seconds on a loaded
    host). The paused batch's fenced completion must not keep the rows of a
    key it lost, nor of the others beside it: each event's effect exactly
    once, nothing dead."""
    release = tmp_path / "release"
    env = {
        "WEBHOOK_INGEST_SOURCES": write_sources(
            tmp_path / "s.toml",
            f"{HANDLERS}:paused_batch",
            database_url=settings.database_url,
            pause_seconds=60,
            release_file=str(release),
        ),
        "WEBHOOK_INGEST_LOCK_TTL": "1",
    }
    events = [make_event("acme", f"evt_{n}") for n in range(40)]
    await publish_events(settings.amqp_url, settings.namespace, events)
    paused = fleet.worker("--concurrency", "64", env=env)
    await wait_until(lambda: count_rows(settings.database_url, "runs_started"), 60, message="the paused batch")
    connection = await asyncpg.connect(settings.database_url)
    try:
        in_the_batch = {row["key"] for row in await connection.fetch("SELECT key FROM runs_started")}
    finally:
        await connection.close()
    assert len(in_the_batch) >= 2
    successor = fleet.worker("--concurrency", "64", env=env)
    await wait_for_output(successor, "worker_consuming")
    await publish_events(settings.amqp_url, settings.namespace, [e for e in events if e.key in in_the_batch])
    await wait_for_output(successor, '"reason":"TurnTaken"')  # its copies met the paused batch's turns
    release.touch()

    await until_completed(settings.database_url, len(events), timeout=60)
    await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
    await asyncio.sleep(2)  # a retry or deferral still on its way would show by now
    await assert_each_once(settings.database_url, events)
    assert "batch_crashed" not in paused.output()


async def test_mixed_modes_never_run_one_key_at_the_same_time(settings, fleet, tmp_path):
    """One worker without Redis (degraded), one with; each event's two
    copies 0.1 s apart; a 400 ms external effect: no two runs of a key
    overlap, and each key runs once (issue 10, item 1)."""
    sources = write_sources(
        tmp_path / "s.toml", "tests.support.handlers:external_effect", database_url=settings.database_url
    )
    degraded = fleet.worker(
        "--concurrency",
        "1",
        env={"WEBHOOK_INGEST_SOURCES": sources, "REDIS_URLS": f"redis://127.0.0.1:{free_port()}/0"},
    )
    locked = fleet.worker("--concurrency", "1", env={"WEBHOOK_INGEST_SOURCES": sources})
    for worker in (degraded, locked):
        await wait_for_output(worker, "worker_consuming")
    events = [make_event("acme", f"evt_{n}") for n in range(16)]
    for event in events:
        await publish_events(settings.amqp_url, settings.namespace, [event])
        await asyncio.sleep(0.1)
        await publish_events(settings.amqp_url, settings.namespace, [event])

    await until_completed(settings.database_url, 16, timeout=90)
    await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
    await asyncio.sleep(1.5)  # a deferred copy comes back after 1 s
    runs = await recorded_runs(settings.database_url)
    by_key: dict[str, list] = {}
    for run in runs:
        by_key.setdefault(run["key"], []).append(run)
    assert {key: len(key_runs) for key, key_runs in by_key.items()} == {event.key: 1 for event in events}
    assert "idempotency_store_degraded" in degraded.output()


async def test_an_event_of_a_source_no_worker_knows_yet_waits_for_one(settings, fleet, tmp_path):
    """A rolling deploy: the ingress knows a source the running workers do
    not. The event waits in a delay queue (no dead letter within seconds, no
    requeue loop), and a worker that knows the source processes it (item 8)."""
    old = write_sources(tmp_path / "old.toml", "tests.support.handlers:counted_inbox")
    new_path = tmp_path / "new.toml"
    old_text = (tmp_path / "old.toml").read_text()
    new_path.write_text(old_text + old_text.replace("[sources.acme]", "[sources.newer]"))
    old_worker = fleet.worker("--concurrency", "4", env={"WEBHOOK_INGEST_SOURCES": old})
    await wait_for_output(old_worker, "worker_consuming")
    event = make_event("newer", "evt_rolling")
    await publish_events(settings.amqp_url, settings.namespace, [event])

    await wait_for_output(old_worker, "unknown_source_waiting")
    await asyncio.sleep(6)  # past one wait in the delay queue
    assert await count_rows(settings.database_url, "dead_letters") == 0
    assert old_worker.output().count("unknown_source_waiting") <= 3  # a wait, not a hot loop
    fleet.worker("--concurrency", "4", env={"WEBHOOK_INGEST_SOURCES": str(new_path)})
    await until_completed(settings.database_url, 1, timeout=60)
    assert await effects_by_key(settings.database_url) == {event.key: 1}


async def test_sigterm_during_a_one_second_handler_exits_0_and_every_event_completes_once(settings, fleet, tmp_path):
    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", "tests.support.handlers:one_second_inbox")}
    events = [make_event("acme", f"evt_{n}") for n in range(24)]
    await publish_events(settings.amqp_url, settings.namespace, events)
    stopping = fleet.worker("--concurrency", "8", env=env)
    await wait_for_output(stopping, "worker_consuming")
    await asyncio.sleep(0.5)  # its first handlers are half way through

    assert await asyncio.to_thread(stopping.terminate, 30) == 0
    finished_in_grace = await count_rows(settings.database_url, "processed_events")
    assert 1 <= finished_in_grace < len(events)

    fleet.worker("--concurrency", "8", env=env)
    await until_completed(settings.database_url, len(events))
    await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
    await asyncio.sleep(1)
    await assert_each_once(settings.database_url, events)


async def test_same_key_with_another_payload_is_recorded_as_a_conflict_and_not_run(settings, fleet, tmp_path):
    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", "tests.support.handlers:counted_inbox")}
    first, tampered = make_event("acme", "evt_1", {"amount": 100}), make_event("acme", "evt_1", {"amount": 999})
    worker, metrics_url = metered_worker(fleet, env, "--concurrency", "4")
    await publish_events(settings.amqp_url, settings.namespace, [first])
    await until_completed(settings.database_url, 1)
    await publish_events(settings.amqp_url, settings.namespace, [tampered])

    await until_every_message_handled([metrics_url], 2)
    assert (await outcomes([metrics_url])).get("conflict") == 1
    connection = await asyncpg.connect(settings.database_url)
    try:
        conflict = await connection.fetchrow("SELECT * FROM event_conflicts")
        amount = await connection.fetchval("SELECT payload->>'amount' FROM inbox")
    finally:
        await connection.close()
    assert (conflict["key"], conflict["completed_sha256"], conflict["conflicting_sha256"]) == (
        first.key,
        first.payload_sha256,
        tampered.payload_sha256,
    )
    assert amount == "100" and await effects_by_key(settings.database_url) == {first.key: 1}
    settled = [orjson.loads(line) for line in worker.output().splitlines() if '"event_processed"' in line]
    assert [(line["key"], line["source"], line["attempt"], line["outcome"]) for line in settled] == [
        (first.key, "acme", 1, "processed"),
        (first.key, "acme", 1, "conflict"),
    ]  # on-call can follow the key
    assert all(line["duration_ms"] >= 0 for line in settled)


async def test_run_supervises_ingress_and_workers_and_send_test_with_copies_gives_one_row(service_env, settings, fleet):
    port = free_port()
    supervisor = fleet.supervisor("--port", str(port), "--ingress-processes", "2", "--workers", "2")
    base_url = f"http://127.0.0.1:{port}"
    await _wait_ready(base_url)
    await wait_until(lambda: _consumers(settings), 60, message="two consuming workers")

    sent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "webhook_ingest",
        "send-test",
        "demo",
        "--duplicates",
        "3",
        "--url",
        base_url,
        env={**os.environ, **service_env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output = (await sent.communicate())[0].decode()
    assert sent.returncode == 0 and output.count("accepted") == 4, output

    await until_completed(settings.database_url, 1)
    await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
    await asyncio.sleep(1.5)  # a deferred copy comes back after 1 s
    assert await count_rows(settings.database_url, "inbox") == 1

    children = _child_pids(supervisor.pid)
    assert len(children) == 4  # two ingress processes sharing the port, two workers
    supervisor.popen.send_signal(signal.SIGINT)
    assert await asyncio.to_thread(supervisor.popen.wait, 60) == 0
    assert not [pid for pid in children if _alive(pid)]


async def _consumers(settings) -> bool:
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel()
        try:
            queue = await channel.declare_queue(topology.events_queue(settings.namespace), passive=True)
        except aio_pika.exceptions.ChannelClosed:  # not declared yet
            return False
        return queue.declaration_result.consumer_count == 2


def _child_pids(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as children:
        return [int(child) for child in children.read().split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as status:
            return "zombie" not in status.read()
    except FileNotFoundError:
        return False


async def _until_redis_forgot(settings, key: str) -> None:
    """Until the key's done marker (WEBHOOK_INGEST_DONE_TTL, 1 s here) was
    written and has expired: Redis forgot the key."""
    client = redis.from_url(settings.redis_urls[0])
    name = key_prefix(settings.namespace) + key

    async def marked() -> bool:
        return (await client.get(name) or b"").startswith(DONE_PREFIX.encode())

    async def forgotten() -> bool:
        return not await client.exists(name)

    try:
        await wait_until(marked, 10, message="the done marker")
        await wait_until(forgotten, 10, message="the done marker expired")
    finally:
        await client.aclose()


async def _cli(service_env: dict, *args: str) -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "webhook_ingest",
        *args,
        env={**os.environ, **service_env},
        stdout=asyncio.subprocess.DEVNULL,
    )
    assert await asyncio.wait_for(process.wait(), 60) == 0


async def test_a_conflicting_payload_after_a_retried_completion_is_recorded_as_a_conflict(settings, fleet, tmp_path):
    """An event fails its first attempt and completes on its second
    (key_fences: chain 0, attempt 1 handed on). Redis forgets the key (its
    done marker lives WEBHOOK_INGEST_DONE_TTL: a day by default, 1 s here).
    Then the provider sends the same key with another payload. §5: that is
    a conflict — not processed again, logged with both hashes, counted
    `conflict` and recorded in event_conflicts for operators. Without a
    failed attempt before the completion it is (test_exactly_once); with
    one, the attempt check runs before the completion check, and the
    conflicting payload is acked as a copy of attempt 1, unrecorded."""
    env = {
        "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", f"{HANDLERS}:inbox_failing_odd_ids_once"),
        "WEBHOOK_INGEST_DONE_TTL": "1",
    }
    worker = fleet.worker("--concurrency", "4", env=env)
    await wait_for_output(worker, "worker_consuming")
    first = make_event("acme", "evt_1", {"amount": 100})  # odd: its first attempt fails
    await publish_events(settings.amqp_url, settings.namespace, [first])
    await wait_until(lambda: count_rows(settings.database_url, "processed_events"), 30, message="the completion")
    assert (await _fetchrow(settings.database_url, "SELECT attempts FROM processed_events"))["attempts"] == 2
    await _until_redis_forgot(settings, first.key)

    tampered = make_event("acme", "evt_1", {"amount": 999})
    await publish_events(settings.amqp_url, settings.namespace, [tampered])
    await _settled_quietly(settings, 1)

    assert await _where_is(settings.database_url, first.key) == {
        "completed": 1,
        "open_dead_letters": 0,
        "conflicts": 1,
    }, "attempt_already_handed_on" in worker.output()
    assert "payload_conflict" in worker.output()


async def test_after_prune_forgot_a_retried_completion_a_resend_is_processed_again(
    settings, service_env, fleet, tmp_path
):
    """operations.md, Retention and pruning: "a manual resend from a
    provider's dashboard of an event whose record was pruned is processed
    again". The event completed on its second attempt 31 days ago (attempt 1
    handed on); a copy came 20 days ago (Redis had forgotten the key: a
    duplicate found in Postgres — which took the key's lease and so touched
    its fence row). `prune --older-than 30d` deletes the completion but not
    the fence row, which keeps the attempt record. The provider's manual
    resend today is acked as a copy of attempt 1 and never processed."""
    env = {
        "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", f"{HANDLERS}:inbox_failing_odd_ids_once"),
        "WEBHOOK_INGEST_DONE_TTL": "1",
    }
    worker = fleet.worker("--concurrency", "4", env=env)
    await wait_for_output(worker, "worker_consuming")
    event = make_event("acme", "evt_3")  # odd: its first attempt fails, its second completes
    await publish_events(settings.amqp_url, settings.namespace, [event])
    await wait_until(lambda: count_rows(settings.database_url, "processed_events"), 30, message="the completion")
    await _until_redis_forgot(settings, event.key)
    await publish_events(settings.amqp_url, settings.namespace, [event])  # the copy of "20 days ago"
    await _settled_quietly(settings, 1)
    connection = await asyncpg.connect(settings.database_url)
    try:  # time passes
        await connection.execute("UPDATE processed_events SET completed_at = now() - interval '31 days'")
        await connection.execute("UPDATE key_fences SET updated_at = now() - interval '20 days'")
    finally:
        await connection.close()
    await _cli(service_env, "prune", "--older-than", "30d")
    assert await count_rows(settings.database_url, "processed_events") == 0

    await publish_events(settings.amqp_url, settings.namespace, [event])  # the manual resend
    await _settled_quietly(settings)
    assert await count_rows(settings.database_url, "processed_events") == 1, (
        "attempt_already_handed_on" in worker.output()
    )
