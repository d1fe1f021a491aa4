"""Adversary, round 3: the attempt record ("handed on", f1164af), the retry
publish that waits for its confirm (915225d), the lease holder that closes
its session (07141b4, 7587f9e, 716d86b) and the copies that settle with
their leader (f1b7d7d, a9bae3a), read as an attacker would, against real
worker processes and the real services. A test marked xfail(strict) is a
finding not fixed yet: it fails on purpose, and the suite says so once it
passes.
"""

import asyncio
import os
import sys

import asyncpg
import pytest
import redis.asyncio as redis

from tests.support.broker import amqp_port
from tests.support.events import make_event, publish_events, queue_depth
from tests.support.exactly_once import recorded_runs, write_sources
from tests.support.processes import count_rows, wait_for_output, wait_until
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.redis_keys import DONE_PREFIX, key_prefix

pytestmark = pytest.mark.usefixtures("effects_tables")
ADVERSARY = "tests.support.adversary_handlers"
HANDLERS = "tests.support.handlers"


async def _queue_empty(settings) -> bool:
    return await queue_depth(settings.amqp_url, topology.events_queue(settings.namespace)) == 0


async def _settled_quietly(settings, seconds: float = 3) -> None:
    """Until the events queue is empty, then a few seconds more: retries
    (0.5 s) and deferrals (1 s) come back within that."""
    await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
    await asyncio.sleep(seconds)


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


async def _dlq(service_env: dict, *args: str) -> None:
    """`webhook-ingest dlq ARGS`, as on-call runs it."""
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "webhook_ingest",
        "dlq",
        *args,
        env={**os.environ, **service_env},
        stdout=asyncio.subprocess.DEVNULL,
    )
    assert await asyncio.wait_for(process.wait(), 60) == 0


async def _fetchrow(database_url: str, sql: str, *args):
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetchrow(sql, *args)
    finally:
        await connection.close()


async def _where_is(database_url: str, key: str) -> dict:
    """Everything the event could have become: completed, a dead letter on-call
    can see, or a conflict recorded for operators."""
    row = await _fetchrow(
        database_url,
        """
        SELECT (SELECT count(*) FROM processed_events WHERE key = $1) AS completed,
               (SELECT count(*) FROM dead_letters WHERE key = $1 AND status = 'dead') AS open_dead_letters,
               (SELECT count(*) FROM event_conflicts WHERE key = $1) AS conflicts""",
        key,
    )
    return dict(row)


async def test_replaying_an_earlier_dead_letter_again_runs_the_event_again(settings, service_env, fleet, tmp_path):
    """The receiver is down. The event's chain ends in dead letter 1;
    on-call replays it (`dlq replay 1`): chain 1 runs its three attempts and
    ends in dead letter 2. The receiver is fixed (or on-call wants one more
    try) and on-call replays dead letter 1 again by its id — which `dlq
    replay ID` allows whatever the row's status ("an explicit id is the
    operator's decision", shared/dead_letters/queries.sql), and says it replayed. §8: a
    replay puts the event back with a fresh attempt budget; it must run
    again. It is acked as a duplicate instead: its chain (replay_of = 1) is
    lower than the recorded one (1 as well, attempt 3 handed on), so its
    attempt 1 counts as already handed on."""
    sources = write_sources(tmp_path / "s.toml", f"{ADVERSARY}:failing_external", database_url=settings.database_url)
    worker = fleet.worker("--concurrency", "1", env={"WEBHOOK_INGEST_SOURCES": sources})
    await wait_for_output(worker, "worker_consuming")
    event = make_event("acme", "evt_replayed_twice")
    await publish_events(settings.amqp_url, settings.namespace, [event])
    await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 30, message="dead letter 1")

    await _dlq(service_env, "replay", "1")
    await wait_until(
        lambda: count_rows(settings.database_url, "dead_letters", "status = 'dead'"),
        30,
        message="dead letter 2, the first replay's",
    )
    await _settled_quietly(settings, 1)
    assert len(await recorded_runs(settings.database_url)) == 6  # two chains of three

    await _dlq(service_env, "replay", "1")  # once more, by the id on-call has at hand
    await _settled_quietly(settings)

    attempts = sorted(run["started"] for run in await recorded_runs(settings.database_url))
    assert attempts == [1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 3.0, 3.0, 3.0], (
        attempts,
        "attempt_already_handed_on" in worker.output(),
    )


async def test_after_its_dead_letter_is_discarded_an_event_sent_again_runs(settings, service_env, fleet, tmp_path):
    """The receiver is down; the event's chain ends in a dead letter, which
    on-call discards (the provider will send it again once its side is
    fixed, or the event was judged not worth a replay). Then the provider
    sends the event again, and the receiver is up. §8: "a copy of an event
    that is an open dead letter is a duplicate until on-call replays it" —
    this one is not open any more, so the copy is an event answered 200
    that must run (§7.3). It is acked as a duplicate of chain 0's attempt 3
    instead, and the event is nowhere: not completed, no open dead letter."""
    sources = write_sources(
        tmp_path / "s.toml", f"{ADVERSARY}:fails_until_dead_lettered", database_url=settings.database_url
    )
    worker = fleet.worker("--concurrency", "1", env={"WEBHOOK_INGEST_SOURCES": sources})
    await wait_for_output(worker, "worker_consuming")
    event = make_event("acme", "evt_discarded_then_sent_again")
    await publish_events(settings.amqp_url, settings.namespace, [event])
    await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 30, message="the dead letter")
    await _settled_quietly(settings, 1)
    await _dlq(service_env, "discard", "1")

    await publish_events(settings.amqp_url, settings.namespace, [event])  # the provider sends it again
    await _settled_quietly(settings)

    assert await _where_is(settings.database_url, event.key) == {
        "completed": 1,
        "open_dead_letters": 0,
        "conflicts": 0,
    }, "attempt_already_handed_on" in worker.output()


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


async def test_another_payload_under_a_dead_lettered_key_is_recorded_somewhere(settings, fleet, tmp_path):
    """The receiver is down and the event's chain ends in a dead letter.
    The provider then sends the key again with another payload (a
    corrected event). Whatever the right outcome — run (the key never
    completed), a dead letter of its own, or a conflict recorded for
    operators (§5) — an event answered 200 must end somewhere (§7.3). It is
    acked as a copy of chain 0's attempt 3 and leaves no trace: discard the
    first dead letter and the second payload is lost."""
    sources = write_sources(tmp_path / "s.toml", f"{ADVERSARY}:failing_external", database_url=settings.database_url)
    worker = fleet.worker("--concurrency", "1", env={"WEBHOOK_INGEST_SOURCES": sources})
    await wait_for_output(worker, "worker_consuming")
    first = make_event("acme", "evt_corrected", {"amount": 100})
    await publish_events(settings.amqp_url, settings.namespace, [first])
    await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 30, message="the dead letter")
    await _settled_quietly(settings, 1)

    corrected = make_event("acme", "evt_corrected", {"amount": 101})
    await publish_events(settings.amqp_url, settings.namespace, [corrected])
    await _settled_quietly(settings)

    traces = await _fetchrow(
        settings.database_url,
        """
        SELECT (SELECT count(*) FROM runs WHERE started = 1) - 1 AS runs,
               (SELECT count(*) FROM dead_letters WHERE payload_sha256 = $1) AS dead_letters,
               (SELECT count(*) FROM event_conflicts WHERE conflicting_sha256 = $1) AS conflicts,
               (SELECT count(*) FROM processed_events WHERE payload_sha256 = $1) AS completed""",
        corrected.payload_sha256,
    )
    assert any(dict(traces).values()), (dict(traces), "attempt_already_handed_on" in worker.output())


@pytest.mark.xfail(
    strict=True,
    reason=(
        "finding B4: a worker shut down (SIGTERM) while its failed attempt's retry publish waits for a blocked "
        "broker's confirm is cancelled at the grace's end: the attempt was never recorded as handed on, its "
        "message comes back and the attempt runs again (4 attempts for max_attempts 3)"
    ),
)
async def test_a_shutdown_while_a_retry_waits_for_its_confirm_does_not_run_the_attempt_again(settings, fleet, tmp_path):
    """A rolling deploy during a broker alarm: the handler's attempt 1 fails,
    its retry publish is not confirmed (the broker blocks publishers: here
    the worker's AMQP path stalls), and 915225d waits for the confirm rather
    than publishing again. SIGTERM: the worker stops taking messages, and at
    the end of its grace cancels what is still running — the wait for the
    confirm, although the handler finished long ago. The message is not
    acked and the attempt not recorded, so when the broker takes the
    connection's frames again the attempt's message is redelivered to
    another worker and attempt 1 runs a second time (beside the retry that
    was published already). §8: attempted max_attempts (3) times in all —
    the design's exceptions are a killed worker and two faults at once, not
    a shutdown."""
    from tests.support.tcpproxy import TcpProxy

    sources = write_sources(
        tmp_path / "s.toml", f"{ADVERSARY}:failing_external", database_url=settings.database_url, seconds=1
    )
    event = make_event("acme", "evt_shutdown_while_blocked")
    with TcpProxy("127.0.0.1", amqp_port()) as broker:
        leaving = fleet.worker(
            "--concurrency",
            "1",
            "--grace-seconds",
            "7",
            env={"WEBHOOK_INGEST_SOURCES": sources, "AMQP_URL": broker.url_for(settings.amqp_url)},
        )
        await wait_for_output(leaving, "worker_consuming")
        await publish_events(settings.amqp_url, settings.namespace, [event])
        await wait_until(
            lambda: count_rows(settings.database_url, "runs"), 30, interval=0.05, message="attempt 1 running"
        )
        leaving.popen.send_signal(15)  # SIGTERM: the deploy
        await asyncio.sleep(0.5)  # it stops consuming (its basic.cancel answered)
        broker.stall()  # the alarm: the retry publish of the failing attempt waits for its confirm
        await wait_for_output(leaving, "broker_publish_waiting", timeout=20)
        await wait_for_output(leaving, "handlers_cancelled_at_grace_end", timeout=20)
        staying = fleet.worker("--concurrency", "2", env={"WEBHOOK_INGEST_SOURCES": sources})
        await wait_for_output(staying, "worker_consuming")
        broker.flow()  # the alarm clears
        await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 60, message="the dead letter")
        await _settled_quietly(settings)
    attempts = sorted(run["started"] for run in await recorded_runs(settings.database_url))
    assert attempts == [1.0, 2.0, 3.0], attempts


async def test_a_replay_published_twice_runs_each_attempt_of_its_chain_once(settings, fleet, tmp_path):
    """Safe (regression): a replay whose row stayed `dead` after its publish
    (the replaying process died before its commit) is replayed again: two
    messages of one new chain (x-replay-of = the dead letter's id), attempt
    1 each, on two workers. The chain runs attempts 1, 2 and 3 once each and
    ends as one open dead letter — the copy is recognised by the attempt
    record, not run as a second chain."""
    sources = write_sources(tmp_path / "s.toml", f"{ADVERSARY}:failing_external", database_url=settings.database_url)
    workers = [fleet.worker("--concurrency", "1", env={"WEBHOOK_INGEST_SOURCES": sources}) for _ in range(2)]
    for worker in workers:
        await wait_for_output(worker, "worker_consuming")
    event = make_event("acme", "evt_replay_published_twice")
    await publish_events(settings.amqp_url, settings.namespace, [event])
    await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 30, message="the dead letter")
    await _settled_quietly(settings, 1)

    replay = event.fresh(replay_of=1)
    await publish_events(settings.amqp_url, settings.namespace, [replay, replay])
    await wait_until(lambda: count_rows(settings.database_url, "runs"), 30, message="the replay's runs")
    await wait_until(
        lambda: count_rows(settings.database_url, "dead_letters", "status = 'dead'"),
        30,
        message="the replay's dead letter",
    )
    await _settled_quietly(settings)

    attempts = sorted(run["started"] for run in await recorded_runs(settings.database_url))
    assert attempts == [1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    assert await count_rows(settings.database_url, "dead_letters", "status = 'dead'") == 1


async def test_a_copy_of_an_attempt_whose_retry_waits_for_a_blocked_broker_does_not_run_it_again(
    settings, fleet, tmp_path
):
    """Safe (regression for 915225d with f1164af): attempt 1 failed on the
    worker whose broker path then stalls (an alarm), so its retry publish
    waits for its confirm — longer than the key's lease (3 s). Meanwhile the
    provider sends the event again, to another worker. The waiting run keeps
    its lease renewed through the wait, so the copy is deferred, not run;
    once the broker takes the retry and the attempt is recorded handed on,
    the copy is a duplicate. Attempts 1, 2, 3 once each."""
    from tests.support.tcpproxy import TcpProxy

    sources = write_sources(
        tmp_path / "s.toml", f"{ADVERSARY}:failing_external", database_url=settings.database_url, seconds=0.5
    )
    event = make_event("acme", "evt_copy_while_blocked")
    with TcpProxy("127.0.0.1", amqp_port()) as broker:
        blocked = fleet.worker(
            "--concurrency", "1", env={"WEBHOOK_INGEST_SOURCES": sources, "AMQP_URL": broker.url_for(settings.amqp_url)}
        )
        await wait_for_output(blocked, "worker_consuming")
        await publish_events(settings.amqp_url, settings.namespace, [event])
        await wait_until(
            lambda: count_rows(settings.database_url, "runs"), 30, interval=0.05, message="attempt 1 running"
        )
        broker.stall()  # before its retry is published
        other = fleet.worker("--concurrency", "1", env={"WEBHOOK_INGEST_SOURCES": sources})
        await wait_for_output(other, "worker_consuming")
        await publish_events(settings.amqp_url, settings.namespace, [event])  # the provider's copy
        await asyncio.sleep(5)  # the lease (3 s) would have run out twice over
        broker.flow()
        await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 30, message="the dead letter")
        await _settled_quietly(settings)
    attempts = sorted(run["started"] for run in await recorded_runs(settings.database_url))
    assert attempts == [1.0, 2.0, 3.0]
    assert '"reason":"TurnTaken"' in other.output()  # the copy met the waiting run's lease


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


@pytest.mark.xfail(
    strict=True,
    reason=(
        "finding B6: a worker cut from Postgres after its failed attempt's retry was confirmed cannot record the "
        "attempt handed on nor keep its lease; a copy of the attempt on another worker then runs it again and "
        "starts a second chain (one fault: the broker confirms at once)"
    ),
)
async def test_a_holder_cut_from_postgres_before_its_record_does_not_let_a_copy_run_its_attempt_again(
    settings, fleet, tmp_path
):
    """Attempt 1 of an event fails on worker A; its retry is confirmed by a
    healthy broker at once, but A's Postgres path is cut (a partition, a
    failover) just before, so A can neither write the attempt record nor
    renew the key's lease: the record waits for Postgres (retried for ever,
    7587f9e), the lease runs out on the server. The provider sends the event
    again (it does, routinely), to worker B, which reaches Postgres: it finds
    the lease free and no record, and runs attempt 1 again — a second retry
    chain for one failed attempt. §8: attempted max_attempts (2) times; the
    design names a killed worker and "a holder that cannot keep its lease
    while it waits for the broker's confirm (Postgres unreachable from it,
    too): two faults at once" — here the broker answered, one fault is enough."""
    from tests.support.tcpproxy import TcpProxy

    sources = write_sources(
        tmp_path / "s.toml", f"{ADVERSARY}:failing_external", database_url=settings.database_url, seconds=2
    )
    text = (tmp_path / "s.toml").read_text()  # a retry delay longer than the lease: the copy comes first
    (tmp_path / "s.toml").write_text(
        text.replace("max_attempts = 3\nretry_delays = [0.5]", "max_attempts = 2\nretry_delays = [8]")
    )
    event = make_event("acme", "evt_cut_before_record")
    with TcpProxy("127.0.0.1", 5432) as postgres:
        cut_off = fleet.worker(
            "--concurrency",
            "1",
            env={"WEBHOOK_INGEST_SOURCES": sources, "DATABASE_URL": postgres.url_for(settings.database_url)},
        )
        await wait_for_output(cut_off, "worker_consuming")
        await publish_events(settings.amqp_url, settings.namespace, [event])
        await wait_until(
            lambda: count_rows(settings.database_url, "runs"), 30, interval=0.05, message="attempt 1 running"
        )
        await asyncio.sleep(1.2)
        postgres.cut()  # the handler fails 0.8 s later, before the lease counts as lost: a failed attempt
        fleet.worker("--concurrency", "2", env={"WEBHOOK_INGEST_SOURCES": sources})
        await wait_for_output(cut_off, "attempt_record_waiting_for_postgres", timeout=20)
        await publish_events(settings.amqp_url, settings.namespace, [event])  # the provider's copy
        await asyncio.sleep(6)  # the lease has run out on the server
        postgres.restore()
        await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 60, message="the dead letter")
        await _settled_quietly(settings)
    attempts = sorted(run["started"] for run in await recorded_runs(settings.database_url))
    assert attempts == [1.0, 2.0], attempts
