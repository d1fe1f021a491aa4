"""Pausing a source with real worker processes (issue 23, item 4): its
events are kept, not processed, across a worker's SIGKILL and restart; the
other source's events go on; resuming processes every kept event once."""

import asyncio

import asyncpg
import pytest
from click.testing import CliRunner

from tests.support.events import make_event, publish_events, queue_depth
from tests.support.processes import count_rows, wait_for_output, wait_until
from webhook_ingest.cli.main import main
from webhook_ingest.shared.broker import topology

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
