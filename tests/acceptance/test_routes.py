"""Routes: one event, several handlers (docs/reference.md §3 `routes`,
docs/design.md "Routes"), with real worker processes.

Each (event, route) pair runs exactly once and independently: one route
failing until dead-lettered does not re-run the other; a replay of its dead
letter runs only it; copies of the event across two workers and a worker
killed while it fans out run each route once.
"""

import asyncio
from dataclasses import replace

import asyncpg
import pytest

from tests.acceptance.test_retries import dlq_json, webhook_ingest
from tests.support.events import make_event, publish_events
from tests.support.processes import count_rows, wait_for_output, wait_until
from webhook_ingest.shared.sources.model import load_sources

pytestmark = pytest.mark.slow


def write_sources(path, fail_file: str = "/nonexistent") -> str:
    path.write_text(
        "[sources.acme]\n"
        'scheme = "hmac-sha256"\n'
        'secrets = ["acme-secret"]\n'
        "max_attempts = 2\n"
        "retry_delays = [0.5]\n"
        "\n"
        "[[sources.acme.routes]]\n"
        'name = "billing"\n'
        'handler = "tests.support.handlers:counted_inbox"\n'  # batchable: batched runs too
        'types = ["invoice.*"]\n'
        "\n"
        "[[sources.acme.routes]]\n"
        'name = "audit"\n'
        'handler = "tests.support.route_handlers:fails_while_flagged"\n'
        f'handler_options = {{ fail_file = "{fail_file}" }}\n'
    )
    load_sources(str(path))  # fails at once while the file cannot be read
    return str(path)


async def effects(database_url: str) -> dict[str, int]:
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch("SELECT key, count(*) AS runs FROM effects GROUP BY key")
    finally:
        await connection.close()
    return {row["key"]: row["runs"] for row in rows}


def invoice(event_id: str):
    return make_event("acme", event_id, {"type": "invoice.paid"})


async def test_a_failing_route_is_dead_lettered_alone_and_its_replay_runs_only_it(
    service_env, settings, fleet, tmp_path, effects_tables
):
    fail_file = tmp_path / "fail"
    fail_file.write_text("fail")
    env = {**service_env, "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "sources.toml", str(fail_file))}
    event = invoice("evt_1")
    fleet.worker("--concurrency", "4", env=env)
    await publish_events(settings.amqp_url, settings.namespace, [event])
    await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 30, message="a dead letter")
    await wait_until(lambda: count_rows(settings.database_url, "processed_events"), 30, message="billing's run")

    [listed] = await dlq_json(env, "list")
    assert (listed["key"], listed["route"], listed["attempts"]) == ("acme:evt_1#audit", "audit", 2)
    shown = await dlq_json(env, "show", str(listed["id"]))
    assert shown["route"] == "audit" and shown["event_id"] == "evt_1"
    assert await effects(settings.database_url) == {"acme:evt_1#billing": 1}  # billing ran once, audit never

    fail_file.unlink()
    code, _stdout, stderr = await webhook_ingest(env, "dlq", "replay", str(listed["id"]))
    assert code == 0, stderr
    await wait_until(
        lambda: count_rows(settings.database_url, "processed_events", "key LIKE '%#audit'"),
        30,
        message="audit's completion",
    )
    await asyncio.sleep(1.0)  # room for a wrong second run of billing
    assert await effects(settings.database_url) == {"acme:evt_1#billing": 1, "acme:evt_1#audit": 1}
    assert sorted(await _completed_keys(settings.database_url)) == ["acme:evt_1#audit", "acme:evt_1#billing"]


async def test_an_event_no_route_takes_runs_nothing_and_a_type_filter_holds(
    service_env, settings, fleet, tmp_path, effects_tables
):
    env = {**service_env, "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "sources.toml")}
    fleet.worker(env=env)
    other = make_event("acme", "evt_other", {"type": "customer.created"})  # audit only
    await publish_events(settings.amqp_url, settings.namespace, [other, invoice("evt_inv")])
    await wait_until(_count_is(settings.database_url, 3), 30, message="three completions")
    assert await effects(settings.database_url) == {
        "acme:evt_other#audit": 1,
        "acme:evt_inv#billing": 1,
        "acme:evt_inv#audit": 1,
    }


async def test_copies_across_two_workers_run_each_route_once(service_env, settings, fleet, tmp_path, effects_tables):
    env = {**service_env, "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "sources.toml")}
    events = [invoice(f"evt_{n}") for n in range(40)]
    await publish_events(settings.amqp_url, settings.namespace, [*events, *events, *events])  # three copies each
    fleet.worker("--concurrency", "16", env=env)
    fleet.worker("--concurrency", "16", env=env)
    await wait_until(_count_is(settings.database_url, 80), 60, message="80 completions", interval=0.1)
    await asyncio.sleep(2.5)  # copies deferred while in flight come back after 1 s
    runs = await effects(settings.database_url)
    assert len(runs) == 80 and set(runs.values()) == {1}


async def test_what_a_fan_out_cut_short_leaves_runs_each_route_once(
    service_env, settings, fleet, tmp_path, effects_tables
):
    """A worker killed between publishing some of an event's route messages
    and acking the event: those route messages and the event, redelivered."""
    env = {**service_env, "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "sources.toml")}
    event = invoice("evt_cut")
    billing = replace(event, key=f"{event.key}#billing", route="billing")
    await publish_events(settings.amqp_url, settings.namespace, [billing, event])
    fleet.worker(env=env)
    await wait_until(_count_is(settings.database_url, 2), 30, message="two completions", interval=0.1)
    await asyncio.sleep(1.5)
    assert await effects(settings.database_url) == {"acme:evt_cut#billing": 1, "acme:evt_cut#audit": 1}


async def test_a_worker_killed_while_fanning_out_loses_nothing_and_runs_nothing_twice(
    service_env, settings, fleet, tmp_path, effects_tables
):
    env = {**service_env, "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "sources.toml")}
    events = [invoice(f"evt_{n}") for n in range(300)]
    await publish_events(settings.amqp_url, settings.namespace, events)
    victim = fleet.worker("--concurrency", "32", env=env)
    await wait_until(_count_is(settings.database_url, 20), 60, message="the first completions", interval=0.02)
    victim.kill()  # SIGKILL, mid-stream: fan-outs and runs cut wherever they were
    fleet.worker("--concurrency", "32", env=env)
    await wait_until(_count_is(settings.database_url, 600), 90, message="600 completions", interval=0.2)
    await asyncio.sleep(2.5)
    runs = await effects(settings.database_url)
    assert len(runs) == 600 and set(runs.values()) == {1}


async def test_a_route_message_a_worker_has_no_route_for_waits_and_holds_nothing_up(
    service_env, settings, fleet, tmp_path, effects_tables
):
    """Sources files out of step: a route renamed or removed while its
    messages were queued. Such a message waits for a worker that knows the
    route, as an unknown source's event does; the others run."""
    env = {**service_env, "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "sources.toml")}
    event = invoice("evt_gone")
    gone = replace(event, key=f"{event.key}#gone", route="gone")
    await publish_events(settings.amqp_url, settings.namespace, [gone, invoice("evt_next")])
    worker = fleet.worker(env=env)
    await wait_until(_count_is(settings.database_url, 2), 30, message="evt_next's two routes", interval=0.1)
    await wait_for_output(worker, '"route":"gone","event":"unknown_source_waiting"')
    assert await effects(settings.database_url) == {"acme:evt_next#billing": 1, "acme:evt_next#audit": 1}
    assert "processing_crashed" not in worker.output()


def _count_is(database_url: str, wanted: int):
    async def check():
        return await count_rows(database_url, "processed_events") >= wanted

    return check


async def _completed_keys(database_url: str) -> list[str]:
    connection = await asyncpg.connect(database_url)
    try:
        return [row["key"] for row in await connection.fetch("SELECT key FROM processed_events")]
    finally:
        await connection.close()
