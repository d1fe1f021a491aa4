"""Pausing a source (docs/reference.md §8.3) with real worker processes
(issue 23, item 4): its events are kept, not processed, across a worker's
SIGKILL and restart; the other source's events go on; resuming processes
every kept event once; a pause reaches a worker whose move back waits on a
blocked broker."""

import asyncio
import subprocess

import aio_pika
import asyncpg
import pytest
from click.testing import CliRunner

from tests.support import broker
from tests.support.events import make_event, publish_events, queue_depth
from tests.support.processes import count_rows, wait_for_output, wait_until
from webhook_ingest.cli.main import main
from webhook_ingest.shared.audit.actor import Actor
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.event.message import to_amqp
from webhook_ingest.shared.sources.pauses import PauseStore

pytestmark = pytest.mark.slow

SOURCES = """
[sources.acme]
scheme = "hmac-sha256"
secrets = ["acme-secret"]
handler = "inbox"

[sources.other]
scheme = "hmac-sha256"
secrets = ["other-secret"]
handler = "inbox"
"""


def sources_cli(*args: str):
    return CliRunner().invoke(main, ["sources", *args])


async def inbox_sources(database_url: str) -> dict[str, int]:
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch("SELECT source, count(*) AS n FROM inbox GROUP BY source")
        return {row["source"]: row["n"] for row in rows}
    finally:
        await connection.close()


async def test_a_paused_sources_events_wait_across_a_restart_and_run_once_when_resumed(
    settings, fleet, tmp_path, monkeypatch
):
    path = tmp_path / "sources.toml"
    path.write_text(SOURCES)
    monkeypatch.setenv("WEBHOOK_INGEST_SOURCES", str(path))
    env = {"WEBHOOK_INGEST_SOURCES": str(path)}
    paused = await asyncio.to_thread(sources_cli, "pause", "acme")
    assert paused.stdout.strip() == "source acme paused", paused.output
    worker = fleet.worker(env=env)
    await wait_for_output(worker, "worker_consuming")

    await publish_events(
        settings.amqp_url,
        settings.namespace,
        [make_event("acme", f"evt_{n}") for n in range(30)] + [make_event("other", f"evt_{n}") for n in range(10)],
    )
    parked = topology.paused_queue(settings.namespace, "acme")

    async def all_parked() -> bool:
        return await queue_depth(settings.amqp_url, parked) == 30

    await wait_until(all_parked, 30, message="acme's 30 events parked")
    await wait_until(lambda: _has(settings.database_url, {"other": 10}), 30, message="other's events processed")

    worker.kill()  # SIGKILL; the pause is in Postgres, not in the worker
    worker = fleet.worker(env=env)
    await wait_for_output(worker, "worker_consuming")
    await asyncio.sleep(2)
    assert await inbox_sources(settings.database_url) == {"other": 10}
    assert await queue_depth(settings.amqp_url, parked) == 30
    listed = await asyncio.to_thread(sources_cli, "list")
    assert "acme  paused by cli" in listed.stdout and "waiting: 30" in listed.stdout, listed.output

    resumed = await asyncio.to_thread(sources_cli, "resume", "acme")
    assert resumed.stdout.strip() == "source acme resumed", resumed.output
    await wait_until(
        lambda: _has(settings.database_url, {"acme": 30, "other": 10}), 30, message="acme's kept events processed"
    )
    assert await queue_depth(settings.amqp_url, parked) == 0
    assert await count_rows(settings.database_url, "dead_letters") == 0
    connection = await asyncpg.connect(settings.database_url)
    try:
        actions = [row["action"] for row in await connection.fetch("SELECT action FROM audit_log ORDER BY id")]
    finally:
        await connection.close()
    assert actions == ["pause_source", "resume_source"]
    again = await asyncio.to_thread(sources_cli, "resume", "acme")
    assert again.stdout.strip() == "source acme was not paused"
    unknown = await asyncio.to_thread(sources_cli, "pause", "nope")
    assert (unknown.exit_code, unknown.stderr.strip()) == (2, "error: no source named 'nope' in the sources file")


async def _has(database_url: str, expected: dict[str, int]) -> bool:
    return await inbox_sources(database_url) == expected


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


@pytest.mark.usefixtures("effects_tables")
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
