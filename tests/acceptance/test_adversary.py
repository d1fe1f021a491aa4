"""The processing guarantees (docs/reference.md §7, §8) read as an adversary
would: interleavings and faults that break them, each forced with real
worker processes and real services. A test marked xfail(strict) is a
finding not fixed yet: it fails on purpose, and the suite says so once it
passes.

Handlers come from tests.support.adversary_handlers and record their runs
through their own connection, as an external effect would be.
"""

import asyncio
import dataclasses
import os
import sys
import time

import aio_pika
import asyncpg
import pytest

from tests.conftest import _admin
from tests.support.broker import amqp_port
from tests.support.events import make_event, publish_events, queue_depth
from tests.support.exactly_once import recorded_runs, until_completed, write_sources
from tests.support.processes import count_rows, wait_for_output, wait_until
from tests.support.tcpproxy import TcpProxy
from webhook_ingest.shared.audit.actor import Actor
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.dead_letters.model import record_dead_letter
from webhook_ingest.shared.dead_letters.store import DeadLetterStore

pytestmark = pytest.mark.usefixtures("effects_tables")
HANDLERS = "tests.support.adversary_handlers"


def _overlapping(runs) -> list[tuple]:
    """Pairs of runs of one key whose intervals intersect."""
    return [
        (a["pid"], b["pid"])
        for i, a in enumerate(runs)
        for b in runs[i + 1 :]
        if a["key"] == b["key"] and a["started"] < b["ended"] and b["started"] < a["ended"]
    ]


async def _first_run_pid(database_url: str) -> int:
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetchval("SELECT pid FROM runs_started ORDER BY ctid LIMIT 1")
    finally:
        await connection.close()


async def _queue_empty(settings) -> bool:
    return await queue_depth(settings.amqp_url, topology.events_queue(settings.namespace)) == 0


async def test_a_holder_that_loses_its_postgres_session_mid_handler_has_no_run_beside_it(settings, fleet, tmp_path):
    """Worker A (Postgres through a proxy, Redis fine) runs a 4 s external
    effect; its Postgres connection is cut as it starts (a failover, a network
    cut): the server ends A's session and with it the key's advisory lock,
    while A's handler — which does not touch ctx.db until its end — keeps
    running, and A keeps its Redis lock extended. A copy of the event
    reaches worker B: no two runs of the key may overlap (§7.2)."""
    runs = await _runs_with_the_holders_session_cut(settings, fleet, tmp_path, handler_seconds=4)
    assert _overlapping(runs) == [], runs


async def test_a_holder_cut_from_postgres_during_a_handler_longer_than_its_lease_has_no_run_beside_it(
    settings, fleet, tmp_path
):
    """Finding 1 again with a 9 s external effect (a slow receiver; forward
    waits up to 10 s): the holder's lease runs out while its handler still
    calls the outside world. No two runs of the key may overlap (§7.2): the
    holder, unable to renew its lease, cancels its handler first."""
    runs = await _runs_with_the_holders_session_cut(settings, fleet, tmp_path, handler_seconds=9)
    assert _overlapping(runs) == [], runs


async def _runs_with_the_holders_session_cut(
    settings, fleet, tmp_path, handler_seconds: float, black_hole: bool = False
) -> list:
    """Two workers, each with its own Postgres proxy; the one that takes the
    event first is cut from Postgres as its handler starts (`black_hole`:
    its proxy stalls instead, closing nothing, until the holder settled its
    message); a copy follows."""
    sources = write_sources(
        tmp_path / "s.toml", f"{HANDLERS}:long_external", database_url=settings.database_url, seconds=handler_seconds
    )
    event = make_event("acme", "evt_session_lost")
    with TcpProxy("127.0.0.1", 5432) as first, TcpProxy("127.0.0.1", 5432) as second:
        proxies = {}
        for proxy in (first, second):  # each worker reaches Postgres through its own proxy
            worker = fleet.worker(
                "--concurrency",
                "1",
                env={"WEBHOOK_INGEST_SOURCES": sources, "DATABASE_URL": proxy.url_for(settings.database_url)},
            )
            proxies[worker.pid] = (worker, proxy)
        for worker in fleet.processes:
            await wait_for_output(worker, "worker_consuming")
        await publish_events(settings.amqp_url, settings.namespace, [event])
        await wait_until(
            lambda: count_rows(settings.database_url, "runs_started"), 30, interval=0.05, message="the holder's run"
        )
        holder, holder_proxy = proxies[await _first_run_pid(settings.database_url)]
        if black_hole:
            holder_proxy.stall()  # its handler runs on
        else:
            holder_proxy.cut()  # its session ends; its handler runs on
        await publish_events(settings.amqp_url, settings.namespace, [event])  # the provider's retry: the other worker
        await wait_until(lambda: count_rows(settings.database_url, "runs"), 30, message="the holder's run ends")
        if black_hole:  # the holder lets go of its message, not waiting on the black hole
            await wait_for_output(holder, '"outcome":"deferred"')
        holder_proxy.flow()
        holder_proxy.restore()
        await until_completed(settings.database_url, 1, timeout=60)
        await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
        await asyncio.sleep(2)  # a deferred copy comes back after 1 s
    return await recorded_runs(settings.database_url)


async def test_a_holder_whose_postgres_is_black_holed_lets_go_of_the_key(settings, fleet, tmp_path):
    """Adversary note: the holder's Postgres stops answering mid-handler — a
    black hole, nothing closed (a partition; here its proxy stalls). Its
    lease runs out and its handler is cancelled (finding 1b); a rollback
    sent into the black hole would then wait as long as it lasts (hours,
    for a partition), the worker's slot and its message with it. The
    holder closes that session instead and settles its message while the
    black hole lasts; afterwards the event completes once, and no two runs
    overlap (§7.2)."""
    runs = await _runs_with_the_holders_session_cut(settings, fleet, tmp_path, handler_seconds=9, black_hole=True)
    assert _overlapping(runs) == [], runs


async def test_a_postgres_that_refuses_writes_for_a_while_dead_letters_nothing(settings, fleet, tmp_path):
    """A failover as clients see it: for a few seconds the server they are
    connected to is a read-only standby (the old primary, demoted), then
    its sessions end and new ones reach a writable primary. Work must wait
    and resume (§7.4): the event is processed, not dead-lettered."""
    database = settings.database_url.rsplit("/", 1)[1]
    sources = write_sources(tmp_path / "s.toml", "tests.support.handlers:slow_inbox")
    await _admin(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
    worker = fleet.worker(
        "--concurrency", "1", env={"WEBHOOK_INGEST_SOURCES": sources, "WEBHOOK_INGEST_DELIVERY_LIMIT": "2"}
    )
    await wait_for_output(worker, "worker_consuming")
    event = make_event("acme", "evt_read_only")
    await publish_events(settings.amqp_url, settings.namespace, [event], delivery_limit=2)
    await asyncio.sleep(5)  # read-only for 5 s
    await _admin(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')
    await _admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{database}'")

    async def settled() -> bool:
        return (
            await count_rows(settings.database_url, "processed_events")
            + await count_rows(settings.database_url, "dead_letters")
            > 0
        )

    await wait_until(settled, 60, message="the event processed or dead-lettered")
    assert await count_rows(settings.database_url, "dead_letters") == 0
    assert await count_rows(settings.database_url, "inbox") == 1


async def test_sessions_opened_while_postgres_was_read_only_do_not_stay_read_only(settings, fleet, tmp_path):
    """Adversary note: after a failover, the sessions a worker opened against
    the read-only server keep its read-only default though Postgres is
    writable again — here the database's default is reset and no session
    is ended (a pooler or a proxy in front of Postgres keeps them). The
    worker must not wait on them for ever: the event is processed (§7.4)."""
    database = settings.database_url.rsplit("/", 1)[1]
    sources = write_sources(tmp_path / "s.toml", "tests.support.handlers:slow_inbox")
    await _admin(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
    worker = fleet.worker("--concurrency", "1", env={"WEBHOOK_INGEST_SOURCES": sources})
    await wait_for_output(worker, "worker_consuming")
    await publish_events(settings.amqp_url, settings.namespace, [make_event("acme", "evt_read_only_sessions")])
    await asyncio.sleep(3)  # read-only for 3 s
    await _admin(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')

    await until_completed(settings.database_url, 1, timeout=60)
    assert await count_rows(settings.database_url, "dead_letters") == 0
    assert await count_rows(settings.database_url, "inbox") == 1


async def test_an_old_event_of_a_source_no_worker_knows_yet_still_waits_for_one(settings, fleet, tmp_path):
    """A rolling deploy after a 12-minute RabbitMQ outage: the ingress kept
    the event in its outbox and relays it now; the worker that gets it does
    not know its source yet. It must wait for a worker that does (§8), as a
    fresh event would, not become a dead letter on its first look."""
    old = write_sources(tmp_path / "old.toml", "tests.support.handlers:counted_inbox")
    old_text = (tmp_path / "old.toml").read_text()
    new = tmp_path / "new.toml"
    new.write_text(old_text + old_text.replace("[sources.acme]", "[sources.newer]"))
    old_worker = fleet.worker("--concurrency", "4", env={"WEBHOOK_INGEST_SOURCES": old})
    await wait_for_output(old_worker, "worker_consuming")
    event = dataclasses.replace(make_event("newer", "evt_from_the_outbox"), received_at=time.time() - 12 * 60)
    await publish_events(settings.amqp_url, settings.namespace, [event])
    await asyncio.sleep(1)  # the old worker has looked at it
    fleet.worker("--concurrency", "4", env={"WEBHOOK_INGEST_SOURCES": str(new)})

    async def settled() -> bool:
        return (
            await count_rows(settings.database_url, "processed_events")
            + await count_rows(settings.database_url, "dead_letters")
            > 0
        )

    await wait_until(settled, 60, message="the event processed or dead-lettered")
    assert await count_rows(settings.database_url, "dead_letters") == 0
    assert await count_rows(settings.database_url, "inbox") == 1


async def test_copies_of_a_failing_event_do_not_multiply_its_attempts(settings, fleet, tmp_path):
    """A provider sends an event three times at once (it timed out waiting
    for our 200); the receiver behind the handler is down. The event is
    attempted max_attempts (3) times, each after its retry delay (§8) —
    not three times as often, copies hammering the receiver back to back."""
    sources = write_sources(
        tmp_path / "s.toml", f"{HANDLERS}:failing_external", database_url=settings.database_url, seconds=0.3
    )
    worker = fleet.worker("--concurrency", "4", env={"WEBHOOK_INGEST_SOURCES": sources})
    await wait_for_output(worker, "worker_consuming")
    event = make_event("acme", "evt_failing_copies")
    await publish_events(settings.amqp_url, settings.namespace, [event] * 3)

    await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 30, message="the dead letter")
    await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
    await asyncio.sleep(2)  # any other chain's last attempt
    attempts = [run["started"] for run in await recorded_runs(settings.database_url)]
    assert sorted(attempts) == [1.0, 2.0, 3.0]


async def test_a_replayed_event_that_fails_again_at_once_is_an_open_dead_letter(settings, service_env, fleet, tmp_path):
    """Finding 6. An event fails permanently and is a dead letter. On-call
    replays it (the console's button: `DeadLetterStore.replay_if_open`); the worker fails it
    again before the replay's transaction commits (forced here by holding a
    lock its audit insert waits for, after the publish). Afterwards the
    event must again be an open dead letter on-call can see (§7.3, §8): the
    worker's insert waits for the replay's commit, then adds a new row."""
    sources = write_sources(tmp_path / "s.toml", "tests.support.handlers:permanently_fails")
    worker = fleet.worker("--concurrency", "1", env={"WEBHOOK_INGEST_SOURCES": sources})
    await wait_for_output(worker, "worker_consuming")
    await publish_events(settings.amqp_url, settings.namespace, [make_event("acme", "evt_replayed")])
    await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 30, message="the dead letter")

    blocker = await asyncpg.connect(settings.database_url)
    replayer = await asyncpg.connect(settings.database_url)
    replayer_watch = await asyncpg.connect(settings.database_url)  # outside any transaction: a fresh view each time
    broker = await aio_pika.connect_robust(settings.amqp_url)
    try:
        channel = await broker.channel(publisher_confirms=True, on_return_raises=True)
        transaction = blocker.transaction()
        await transaction.start()
        await blocker.execute("LOCK TABLE audit_log IN SHARE MODE")  # the replay's commit waits
        replaying = asyncio.create_task(
            DeadLetterStore(replayer).replay_if_open(channel, settings.namespace, 1, Actor("operator", "test"))
        )
        await wait_until(
            lambda: _waiting_insert(replayer_watch),
            30,
            interval=0.05,
            message="the worker's dead-letter insert waiting for the replay",
        )
        await transaction.commit()
        await asyncio.wait_for(replaying, 10)
        await wait_until(lambda: _logged_twice(worker, "event_dead_lettered"), 30, message="the second dead letter")
    finally:
        await broker.close()
        await replayer_watch.close()
        await replayer.close()
        await blocker.close()
    assert await count_rows(settings.database_url, "dead_letters", "status = 'dead'") == 1
    assert await count_rows(settings.database_url, "dead_letters", "status = 'replayed'") == 1


async def _waiting_insert(connection) -> bool:
    return await connection.fetchval(
        "SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND query LIKE '%INSERT INTO dead_letters%' AND pid <> pg_backend_pid()"
    )


async def _logged_twice(worker, text: str) -> bool:
    return worker.output().count(text) >= 2


async def test_an_event_that_completes_is_not_also_an_open_dead_letter(settings, fleet, tmp_path):
    """Finding 7. An event is an open dead letter — one of its messages hit
    the delivery limit and the drainer recorded it (recorded here as the
    drainer does) — while another copy of it is still queued; the receiver
    is back, and that copy completes. On-call must not be shown a dead
    letter for an event that was processed (issue 10: the dead-letter list
    tells the truth). Two copies failing side by side no longer make two
    chains (finding 8), so the dead letter is set up directly."""
    event = make_event("acme", "evt_two_chains")
    database = await asyncpg.connect(settings.database_url)
    try:
        await record_dead_letter(
            database, event, [{"attempt": 1, "type": "DeliveryLimitExceeded", "message": "redelivered 20 times"}]
        )
    finally:
        await database.close()
    sources = write_sources(
        tmp_path / "s.toml", f"{HANDLERS}:fails_until_dead_lettered", database_url=settings.database_url
    )
    worker = fleet.worker("--concurrency", "1", env={"WEBHOOK_INGEST_SOURCES": sources})
    await wait_for_output(worker, "worker_consuming")
    await publish_events(settings.amqp_url, settings.namespace, [event])

    await until_completed(settings.database_url, 1, timeout=60)
    open_dead_letters = await count_rows(settings.database_url, "dead_letters", "status = 'dead'")
    assert open_dead_letters == 0  # it completed: nothing for on-call to replay


async def test_a_blocked_broker_does_not_multiply_an_events_attempts(settings, fleet, tmp_path):
    """The handler (an external call) fails; RabbitMQ stops taking the
    worker's publishes (a memory or disk alarm blocks publishers; the
    connection stays open) before the failed run's retry is published, for
    12 s, then takes them again. While it is away the worker must wait (§7:
    an outage pauses consuming, uses no attempt), not run the external
    effect again and again (finding 2); afterwards the event is attempted
    max_attempts (3) times in all — one retry message per failed attempt,
    however long the broker was blocked (finding 8)."""
    sources = write_sources(
        tmp_path / "s.toml", f"{HANDLERS}:failing_external", database_url=settings.database_url, seconds=1
    )
    event = make_event("acme", "evt_blocked_broker")
    with TcpProxy("127.0.0.1", amqp_port()) as broker:
        worker = fleet.worker(
            "--concurrency", "1", env={"WEBHOOK_INGEST_SOURCES": sources, "AMQP_URL": broker.url_for(settings.amqp_url)}
        )
        await wait_for_output(worker, "worker_consuming")
        await publish_events(settings.amqp_url, settings.namespace, [event])
        await wait_until(lambda: count_rows(settings.database_url, "runs"), 30, interval=0.05, message="the first run")
        broker.stall()  # before the failed run's retry is published
        await asyncio.sleep(12)  # two publish timeouts and more
        runs_while_away = await count_rows(settings.database_url, "runs")
        broker.flow()
        await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 60, message="the dead letter")
        await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
        await asyncio.sleep(2)  # any other chain's last attempt
    attempts = [run["started"] for run in await recorded_runs(settings.database_url)]
    assert runs_while_away == 1  # the first run only
    assert sorted(attempts) == [1.0, 2.0, 3.0]


async def test_two_messages_of_one_retry_attempt_on_two_workers_run_it_once(settings, fleet, tmp_path):
    """Finding 8 at its root: a retry message that exists twice (a publish
    whose confirm was lost, a lost ack), each copy on another worker. The
    attempt runs once, and so does the next: attempts 2 and 3, then the
    dead letter — not a second chain beside the first."""
    sources = write_sources(
        tmp_path / "s.toml", f"{HANDLERS}:failing_external", database_url=settings.database_url, seconds=1
    )
    workers = [fleet.worker("--concurrency", "1", env={"WEBHOOK_INGEST_SOURCES": sources}) for _ in range(2)]
    for worker in workers:
        await wait_for_output(worker, "worker_consuming")
    retry = dataclasses.replace(make_event("acme", "evt_retry_twice"), attempt=2)
    await publish_events(settings.amqp_url, settings.namespace, [retry, retry])

    await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 30, message="the dead letter")
    await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
    await asyncio.sleep(2)  # any other chain's last attempt
    attempts = [run["started"] for run in await recorded_runs(settings.database_url)]
    assert sorted(attempts) == [2.0, 3.0]


async def test_a_replayed_dead_letter_runs_again_from_its_first_attempt(settings, service_env, fleet, tmp_path):
    """Attempts already run are not run again — but a replay is a new chain:
    its attempt 1 runs though the event's attempts 1 to 3 ran before (§8)."""
    sources = write_sources(
        tmp_path / "s.toml", f"{HANDLERS}:fails_until_dead_lettered", database_url=settings.database_url
    )
    worker = fleet.worker("--concurrency", "1", env={"WEBHOOK_INGEST_SOURCES": sources})
    await wait_for_output(worker, "worker_consuming")
    await publish_events(settings.amqp_url, settings.namespace, [make_event("acme", "evt_replay_runs")])
    await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 30, message="the dead letter")

    replay = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "webhook_ingest", "dlq", "replay", "1", env={**os.environ, **service_env}
    )
    assert await asyncio.wait_for(replay.wait(), 60) == 0
    await until_completed(settings.database_url, 1, timeout=30)
    attempts = [run["started"] for run in await recorded_runs(settings.database_url)]
    assert sorted(attempts) == [1.0, 1.0, 2.0, 3.0]  # the three of the first chain, the replay's first
    assert await count_rows(settings.database_url, "dead_letters", "status = 'dead'") == 0


async def test_a_retry_attempt_whose_worker_was_killed_runs_again(settings, fleet, tmp_path):
    """A worker is SIGKILLed while attempt 2 runs: its message comes back
    and attempt 2 runs again (it was never handed on), then attempt 3 and
    the dead letter — not acked as a copy of an attempt already run."""
    sources = write_sources(
        tmp_path / "s.toml", f"{HANDLERS}:failing_external", database_url=settings.database_url, seconds=2
    )
    env = {"WEBHOOK_INGEST_SOURCES": sources}
    first = fleet.worker("--concurrency", "1", env=env)
    await wait_for_output(first, "worker_consuming")
    await publish_events(settings.amqp_url, settings.namespace, [make_event("acme", "evt_killed_retry")])
    await wait_until(
        lambda: count_rows(settings.database_url, "runs", "started = 2"), 30, interval=0.05, message="attempt 2 running"
    )
    first.kill()
    fleet.worker("--concurrency", "1", env=env)

    await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 60, message="the dead letter")
    await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
    await asyncio.sleep(2)  # any other chain's last attempt
    attempts = [run["started"] for run in await recorded_runs(settings.database_url)]
    assert sorted(attempts) == [1.0, 2.0, 2.0, 3.0]
