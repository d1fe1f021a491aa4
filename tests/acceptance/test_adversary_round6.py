"""Adversary, round 6: pausing a source (fbeac3f) and incidents (fee867c,
db4070f), read as an attacker of the guarantees and checked against real
worker processes and the real services. A test marked xfail(strict) is a
finding not fixed yet: it fails on purpose, and the suite says so once it
passes.
"""

import asyncio
import subprocess

import aio_pika
import asyncpg
import pytest

from tests.support import broker
from tests.support.events import make_event, publish_events, queue_depth
from tests.support.exactly_once import recorded_runs, write_sources
from tests.support.processes import count_rows, wait_for_output, wait_until
from webhook_ingest.cli import layout
from webhook_ingest.shared.audit.actor import Actor
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.event.message import to_amqp
from webhook_ingest.shared.sources.pauses import PauseStore
from webhook_ingest.workers import connection_budget

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("effects_tables")]
ROUND6 = "tests.support.adversary_round6_handlers"
DELIVERY_LIMIT = 2  # what a message that crashes the worker goes round, kept short here


async def _dead_letter_errors(database_url: str) -> list[str]:
    connection = await asyncpg.connect(database_url)
    try:
        return [
            row["type"]
            for row in await connection.fetch("SELECT errors -> -1 ->> 'type' AS type FROM dead_letters ORDER BY id")
        ]
    finally:
        await connection.close()


async def test_a_permanent_failure_quoting_a_nul_is_dead_lettered_after_one_run(settings, fleet, tmp_path):
    """§8: a PermanentError is a dead letter at once, its error kept — and
    shared/db/values.py's `jsonb` keeps any string an error holds ("a lone
    surrogate or NUL becomes U+FFFD"), so that a dead letter can always be
    recorded. Finding R6-1: the incident's count (fee867c), in the same
    transaction, wrote the message as text, which Postgres refused; the dead
    letter was not committed, and the handler — a call to the outside
    world — ran again, once per delivery our own count allows (3 runs at
    limit 2, 21 at the default), the event ending as DeliveryLimitExceeded."""
    await _dead_lettered_after_one_run(settings, fleet, tmp_path, "refused_quoting_a_nul")


async def test_a_permanent_failure_quoting_a_lone_surrogate_is_dead_lettered_after_one_run(settings, fleet, tmp_path):
    """As above, with a lone surrogate (bytes decoded with
    errors="surrogateescape", as os and subprocess hand them over). Finding
    R6-2: besides the count, every log line quoting the error raised in the
    JSON renderer (orjson refuses lone surrogates) — `event_dead_lettered`,
    `event_retry_scheduled`, then `processing_crashed` in the handler of
    crashes itself — so the task running the message died: nothing acked
    or sent it back until the worker restarted (no dead letter in 60 s),
    and then its attempt ran again."""
    await _dead_lettered_after_one_run(settings, fleet, tmp_path, "refused_quoting_a_lone_surrogate")


async def _dead_lettered_after_one_run(settings, fleet, tmp_path, handler: str) -> None:
    sources = write_sources(tmp_path / "s.toml", f"{ROUND6}:{handler}", database_url=settings.database_url)
    worker = fleet.worker(
        "--concurrency",
        "2",
        env={"WEBHOOK_INGEST_SOURCES": sources, "WEBHOOK_INGEST_DELIVERY_LIMIT": str(DELIVERY_LIMIT)},
    )
    await wait_for_output(worker, "worker_consuming")
    await publish_events(
        settings.amqp_url, settings.namespace, [make_event("acme", "evt_unstorable")], delivery_limit=DELIVERY_LIMIT
    )

    await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 60, message="the dead letter")
    attempts = [run["started"] for run in await recorded_runs(settings.database_url)]
    assert (attempts, await _dead_letter_errors(settings.database_url)) == ([1.0], ["PermanentError"])
    assert await count_rows(settings.database_url, "incidents", "dead_letters = 1") == 1


# -- pausing a source ------------------------------------------------------------

PAUSE_SOURCES = """
[sources.acme]
scheme = "hmac-sha256"
secrets = ["acme-secret"]
handler = "inbox"

[sources.other]
scheme = "hmac-sha256"
secrets = ["other-secret"]
handler = "inbox"
"""
STATED_PAUSE_DELAY = 1.0  # reference §8.3: a pause "reaches every worker within about a second"


def _ctl(*args: str) -> str:
    return subprocess.run([*broker.ctl_command(), *args], check=True, capture_output=True, text=True, timeout=60).stdout


async def _memory_alarm(on: bool) -> None:
    """The broker's memory alarm (the suite's private node): it blocks every
    connection that publishes — confirms stop — while deliveries go on."""
    await asyncio.to_thread(_ctl, "set_vm_memory_high_watermark", *(("absolute", "1MB") if on else ("0.4",)))

    async def as_asked() -> bool:
        return ("memory" in await asyncio.to_thread(_ctl, "eval", "rabbit_alarm:get_alarms().")) == on

    await wait_until(as_asked, 30, interval=0.2, message=f"the memory alarm {'on' if on else 'off'}")


async def _change_pause(database_url: str, source: str, pause: bool) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        store = PauseStore(connection)
        assert await (store.pause if pause else store.resume)(source, Actor.cli())
    finally:
        await connection.close()


async def _inbox(database_url: str) -> dict[str, int]:
    connection = await asyncpg.connect(database_url)
    try:
        return {
            row["source"]: row["n"]
            for row in await connection.fetch("SELECT source, count(*) AS n FROM inbox GROUP BY source")
        }
    finally:
        await connection.close()


async def _held_back(settings, events) -> str:
    """A queue of the test's own that dead-letters to NS.events, holding
    `events` until `_let_in` rejects them: they reach the events queue from
    inside the broker, which no alarm blocks."""
    name = f"{settings.namespace}.hold"
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await channel.declare_queue(
            name,
            durable=True,
            arguments={
                "x-queue-type": "quorum",
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": topology.events_queue(settings.namespace),
            },
        )
        for event in events:
            await topology.publish(channel, to_amqp(event), name)
    return name


async def _let_in(settings, name: str) -> None:
    connection = await aio_pika.connect(settings.amqp_url)
    async with connection:
        queue = await (await connection.channel()).get_queue(name, ensure=False)
        while (message := await queue.get(no_ack=False, fail=False)) is not None:
            await message.reject(requeue=False)


async def test_a_pause_reaches_a_worker_whose_move_back_waits_on_a_blocked_broker(settings, fleet, tmp_path):
    """§8.3: a pause reaches every worker within about a second; a paused
    source's events are never run. acme was paused and is resumed: the
    worker takes its parked event to move it back, and its publish waits
    (a memory alarm: RabbitMQ blocks publishers, as a big parked backlog
    moving back can well cause). Then `other` is paused — its downstream
    is down for maintenance — and, three times the stated delay later, its
    events arrive. Finding R6-3: the worker never reread the paused set —
    that happened only after a move, in the same loop — and ran all three."""
    path = tmp_path / "sources.toml"
    path.write_text(PAUSE_SOURCES)
    await _change_pause(settings.database_url, "acme", pause=True)
    worker = fleet.worker("--concurrency", "4", env={"WEBHOOK_INGEST_SOURCES": str(path)})
    await wait_for_output(worker, "worker_consuming")
    await publish_events(settings.amqp_url, settings.namespace, [make_event("acme", "evt_parked")])
    parked_acme = topology.paused_queue(settings.namespace, "acme")
    parked_other = topology.paused_queue(settings.namespace, "other")

    async def acme_parked() -> bool:
        return await queue_depth(settings.amqp_url, parked_acme) == 1

    await wait_until(acme_parked, 30, message="acme's event parked")
    hold = await _held_back(settings, [make_event("other", f"evt_other_{n}") for n in range(3)])

    await _memory_alarm(on=True)
    try:
        await _change_pause(settings.database_url, "acme", pause=False)
        await wait_for_output(worker, "broker_publish_waiting", timeout=30)  # the move's publish
        await _change_pause(settings.database_url, "other", pause=True)
        await asyncio.sleep(3 * STATED_PAUSE_DELAY)
        await _let_in(settings, hold)

        async def taken() -> bool:
            return await queue_depth(settings.amqp_url, topology.events_queue(settings.namespace)) == 0

        await wait_until(taken, 30, message="other's events delivered to the worker")
    finally:
        await _memory_alarm(on=False)

    async def settled() -> bool:
        inbox = await _inbox(settings.database_url)
        other_settled = inbox.get("other", 0) + await queue_depth(settings.amqp_url, parked_other) == 3
        return other_settled and inbox.get("acme") == 1

    await wait_until(settled, 60, message="acme's event processed, other's parked or run")
    assert (await _inbox(settings.database_url), await queue_depth(settings.amqp_url, parked_other)) == ({"acme": 1}, 3)


# -- the incident's row, in every dead letter's transaction --------------------------

TWO_SOURCES_ONE_FAILING = """
[sources.acme]
scheme = "hmac-sha256"
secrets = ["acme-secret"]
handler = "tests.support.handlers:permanently_fails"

[sources.other]
scheme = "hmac-sha256"
secrets = ["other-secret"]
handler = "tests.support.adversary_round6_handlers:inbox_alone"
"""


async def _sessions_waiting_on_a_lock(connection) -> int:
    return await connection.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
    )


async def test_another_sources_event_is_not_held_up_while_an_incidents_row_is_locked(settings, fleet, tmp_path):
    """A worker partitioned from Postgres after its dead letter's upsert of
    the incident row keeps that row locked server-side until TCP keepalives
    end its session (about 25 s: docs/design.md, "Exclusion"); here the
    test's own transaction holds it. Before fee867c a dead letter's
    transaction wrote only its own new row, and nothing of one source's
    failures stood in another source's way. Now each dead letter of that
    incident waits on the row with a statement-pool connection (2 per
    worker at the default budget), and an event of a healthy source — its lease, its completion
    check — waits for one of them (9.97 s here, until the dead letters'
    10 s limit ran out; then they take the connections again). Its handler
    runs alone, as `forward` does: a batch takes its leases on a
    transaction's connection instead."""
    path = tmp_path / "sources.toml"
    path.write_text(TWO_SOURCES_ONE_FAILING)
    worker = fleet.worker(env={"WEBHOOK_INGEST_SOURCES": str(path)})
    await wait_for_output(worker, "worker_consuming")
    await publish_events(settings.amqp_url, settings.namespace, [make_event("acme", "evt_first")])
    await wait_until(
        lambda: count_rows(settings.database_url, "incidents", "dead_letters = 1"),
        30,
        message="the incident, with its first dead letter",
    )

    holder = await asyncpg.connect(settings.database_url)
    try:
        transaction = holder.transaction()
        await transaction.start()
        await holder.execute("SELECT id FROM incidents FOR UPDATE")
        await publish_events(
            settings.amqp_url, settings.namespace, [make_event("acme", f"evt_failing_{n}") for n in range(6)]
        )
        watcher = await asyncpg.connect(settings.database_url)
        try:
            statements = connection_budget.split(settings.worker_connections, layout.CONCURRENCY).statements

            async def pool_held() -> bool:
                return await _sessions_waiting_on_a_lock(watcher) >= statements

            await wait_until(pool_held, 30, message="every statement connection of the worker waiting on the row")
        finally:
            await watcher.close()
        await publish_events(settings.amqp_url, settings.namespace, [make_event("other", "evt_healthy")])
        await wait_until(
            lambda: count_rows(settings.database_url, "processed_events", "source = 'other'"),
            60,
            message="the other source's event completed",
        )
        waited_out = "dead_letter_waiting_for_postgres" in worker.output()
        await transaction.rollback()
    finally:
        await holder.close()
    assert not waited_out, "the other source's event completed only once a dead letter's 10 s limit ran out"
