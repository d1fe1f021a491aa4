"""A replay by filter and window runs each event's handler exactly once per
replay (issue 22, item 5) with real worker processes: one SIGKILLed halfway
through a replay of 1,000 archived events, a second replay of the same
window, and copies of one replay's messages. The handler waits ~100 ms, as
real ones do (tests/support/replay_handlers.py)."""

import asyncio
import json
from datetime import timedelta

import asyncpg
import pytest
from click.testing import CliRunner

from tests.support.archive import archived_event, minutes_ago, seed_archive
from tests.support.events import publish_events, queue_depth
from tests.support.exactly_once import effects_by_key, write_sources
from tests.support.processes import count_rows, wait_for_output, wait_until
from tests.support.replay_handlers import REPLAY_RUNS_TABLE
from tests.support.tcpproxy import free_port
from webhook_ingest.cli.main import main
from webhook_ingest.shared.archive.search import parse_filter
from webhook_ingest.shared.audit.actor import Actor
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.replays.model import replayed_message
from webhook_ingest.shared.replays.store import EventReplayStore

# alone: two workers running ctx.db handlers hold up to ~55 Postgres connections here; beside
# another such test the shared server's 100 ran out ("too many clients already") twice in a row.
pytestmark = [pytest.mark.usefixtures("effects_tables"), pytest.mark.alone]
EVENTS = 1000


@pytest.fixture
async def window(settings):
    """1,000 archived acme events received 30 to 20 minutes ago, and one outside."""
    start = minutes_ago(30)
    arrivals = [
        archived_event("acme", f"evt_{n}", start + timedelta(seconds=0.6 * n), "invoice.paid") for n in range(EVENTS)
    ]
    await seed_archive(settings.database_url, [*arrivals, archived_event("acme", "old", minutes_ago(90))])
    connection = await asyncpg.connect(settings.database_url)
    try:
        await connection.execute(REPLAY_RUNS_TABLE)
    finally:
        await connection.close()
    return [arrival.key for arrival in arrivals]


def replay_window(*more: str) -> dict:
    since, until = minutes_ago(31).isoformat(), minutes_ago(19).isoformat()
    result = CliRunner().invoke(
        main,
        [
            "events",
            "replay",
            "--source",
            "acme",
            "--since",
            since,
            "--until",
            until,
            "--yes",
            "--rate",
            "1000",
            "--json",
            *more,
        ],
    )
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


async def test_a_replay_of_1000_events_with_a_worker_killed_halfway_runs_each_once_per_replay(
    settings, fleet, tmp_path, window
):
    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", "tests.support.replay_handlers:recorded")}
    victim = fleet.worker("--concurrency", "32", env=env)
    fleet.worker("--concurrency", "32", env=env)
    await wait_for_output(victim, "worker_consuming")

    replaying = asyncio.create_task(asyncio.to_thread(replay_window))  # the CLI, publishing as the workers run
    await _until_completed(settings, EVENTS // 2)
    victim.kill()
    assert await count_rows(settings.database_url, "processed_events") < EVENTS  # killed mid-replay
    fleet.worker("--concurrency", "32", env=env)
    first = await replaying
    assert (first["state"], first["total"], first["published"]) == ("done", EVENTS, EVENTS)
    await _until_settled(settings, EVENTS)
    runs = await effects_by_key(settings.database_url)
    assert runs == {f"replay-{first['id']}/{key}": 1 for key in window}  # each once; none of the event's own key

    second = await asyncio.to_thread(replay_window)
    assert second["id"] != first["id"] and second["total"] == EVENTS
    await _until_settled(settings, 2 * EVENTS)
    runs = await effects_by_key(settings.database_url)
    assert runs == {f"replay-{replay['id']}/{key}": 1 for replay in (first, second) for key in window}
    told = await _replay_runs(settings)
    assert told == {(key, replay["id"]) for replay in (first, second) for key in window}  # event.replay said which


@pytest.mark.parametrize("redis", ["redis", "redis-unreachable"])
async def test_copies_of_a_replays_messages_run_each_event_once(settings, fleet, tmp_path, window, redis):
    """As a runner that died between its publish and its progress leaves them,
    or a broker's redelivery: three copies of each of 100 replayed events at
    once, on two workers — also without Redis (its locks lost: Postgres alone)."""
    keys = window[:100]
    connection = await asyncpg.connect(settings.database_url)
    try:
        store = EventReplayStore(connection)
        replay = await store.prepare(parse_filter({"source": "acme", "key": "acme:evt_1"}), Actor.cli())
        arrivals = [await connection.fetchrow("SELECT * FROM event_archive WHERE key = $1", key) for key in keys]
    finally:
        await connection.close()
    messages = [replayed_message(arrival, replay.id) for arrival in arrivals]
    await publish_events(settings.amqp_url, settings.namespace, [m for m in messages for _ in range(3)])
    env = {
        "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", "tests.support.replay_handlers:recorded"),
        **({"REDIS_URLS": f"redis://127.0.0.1:{free_port()}/0"} if redis == "redis-unreachable" else {}),
    }
    workers = [fleet.worker("--concurrency", "32", env=env) for _ in range(2)]
    await _until_settled(settings, len(keys))
    assert await effects_by_key(settings.database_url) == {f"replay-{replay.id}/{key}": 1 for key in keys}
    if redis == "redis-unreachable":
        assert all("idempotency_store_degraded" in worker.output() for worker in workers)


async def _until_completed(settings, count: int) -> None:
    async def done() -> bool:
        return await count_rows(settings.database_url, "processed_events") >= count

    await wait_until(done, 60, message=f"{count} completions")


async def _until_settled(settings, count: int) -> None:
    """`count` completions, the queues empty, and a second more for any copy a kill left to come back."""
    await _until_completed(settings, count)
    queues = [topology.events_queue(settings.namespace), topology.retry_queue(settings.namespace, 1.0)]

    async def drained() -> bool:
        return all([await queue_depth(settings.amqp_url, name) == 0 for name in queues])

    await wait_until(drained, 30, message="empty events and deferral queues")
    await asyncio.sleep(1.5)


async def _replay_runs(settings) -> set[tuple[str, int]]:
    connection = await asyncpg.connect(settings.database_url)
    try:
        rows = await connection.fetch("SELECT key, event_key, events_replay FROM replay_runs")
    finally:
        await connection.close()
    for row in rows:
        assert row["key"] == f"replay-{row['events_replay']}/{row['event_key']}"
    return {(row["event_key"], row["events_replay"]) for row in rows}


async def test_a_replay_of_a_routed_sources_events_runs_every_route_once(settings, fleet, tmp_path, window):
    """A source with two routes: the replay's message is fanned out by the
    worker like the event was, each (event, route) once under replay-R/KEY#ROUTE."""
    sources = tmp_path / "routes.toml"
    sources.write_text(
        '[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["s"]\n'
        '[[sources.acme.routes]]\nname = "billing"\nhandler = "tests.support.replay_handlers:recorded"\n'
        'types = ["invoice.*"]\n'
        '[[sources.acme.routes]]\nname = "crm"\nhandler = "tests.support.replay_handlers:recorded"\n'
    )
    for _ in range(2):
        fleet.worker("--concurrency", "32", env={"WEBHOOK_INGEST_SOURCES": str(sources)})
    keys = window[:50]
    connection = await asyncpg.connect(settings.database_url)
    try:
        replay = await EventReplayStore(connection).prepare(
            parse_filter({"source": "acme", "key": "acme:evt_1"}), Actor.cli()
        )
        arrivals = [await connection.fetchrow("SELECT * FROM event_archive WHERE key = $1", key) for key in keys]
    finally:
        await connection.close()
    await publish_events(
        settings.amqp_url,
        settings.namespace,
        [replayed_message(arrival, replay.id) for arrival in arrivals for _ in range(2)],
    )
    await _until_settled(settings, 2 * len(keys))
    assert await effects_by_key(settings.database_url) == {
        f"replay-{replay.id}/{key}#{route}": 1 for key in keys for route in ("billing", "crm")
    }
    told = await _replay_runs(settings)
    assert told == {(f"{key}#{route}", replay.id) for key in keys for route in ("billing", "crm")}
