"""The worker's group commit (`workers.claim.batch`) with real worker processes:
a failure inside a shared transaction costs the others nothing and leaves
no effect behind; copies inside one batch complete once."""

import dataclasses
import time

import asyncpg

from tests.support.events import make_event, publish_events
from tests.support.processes import count_rows, wait_until

EVENTS = 300


def write_sources(path, handler: str) -> str:
    path.write_text(
        '[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["s"]\n'
        f'handler = "{handler}"\nmax_attempts = 3\nretry_delays = [0.5]\n'
    )
    return str(path)


async def test_a_failing_handler_in_a_batch_rolls_back_only_into_single_passes(service_env, settings, fleet, tmp_path):
    env = {
        "WEBHOOK_INGEST_SOURCES": write_sources(
            tmp_path / "s.toml", "tests.support.handlers:inbox_failing_odd_ids_once"
        )
    }
    events = [make_event("acme", f"evt_{n}") for n in range(EVENTS)]
    await publish_events(settings.amqp_url, settings.namespace, [e for e in events for _ in range(2)])
    for _ in range(2):
        fleet.worker("--concurrency", "64", env=env)

    await wait_until(lambda: _completed(settings.database_url), 120, message=f"{EVENTS} completions")
    attempts = await _attempts_by_key(settings.database_url)
    # Even events completed at their first attempt, though they shared
    # transactions with odd ones that failed; odd ones at their second.
    assert attempts == {e.key: 1 + int(e.event_id.split("_")[1]) % 2 for e in events}
    assert await count_rows(settings.database_url, "inbox") == EVENTS  # the rolled-back rows left nothing
    assert await count_rows(settings.database_url, "dead_letters") == 0


async def test_copies_of_one_event_in_one_batch_complete_once(service_env, settings, fleet, tmp_path):
    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", "inbox")}
    events = [make_event("acme", f"evt_{n}") for n in range(EVENTS)]
    # Five copies back to back: most land in the same batch as their first.
    await publish_events(settings.amqp_url, settings.namespace, [e for e in events for _ in range(5)])
    fleet.worker("--concurrency", "64", env=env)

    await wait_until(lambda: _completed(settings.database_url), 120, message=f"{EVENTS} completions")
    assert await count_rows(settings.database_url, "inbox") == EVENTS
    assert set((await _attempts_by_key(settings.database_url)).values()) == {1}


async def _completed(database_url: str) -> bool:
    return await count_rows(database_url, "processed_events") >= EVENTS


async def _attempts_by_key(database_url: str) -> dict[str, int]:
    connection = await asyncpg.connect(database_url)
    try:
        return {r["key"]: r["attempts"] for r in await connection.fetch("SELECT key, attempts FROM processed_events")}
    finally:
        await connection.close()


async def test_an_event_of_a_source_no_worker_knew_for_ten_minutes_ends_as_a_dead_letter(
    service_env, settings, fleet, tmp_path
):
    """Not a requeue loop: the stray event has waited for a worker that knows
    its source for 11 minutes already (the header the waiting carries), so
    it becomes an UnknownSource dead letter; the good one is not blocked."""
    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", "inbox")}
    waited_since = round((time.time() - 11 * 60) * 1000)
    stray = dataclasses.replace(make_event("ghost", "evt_stray"), unknown_source_since_ms=waited_since)
    good = make_event("acme", "evt_good")
    await publish_events(settings.amqp_url, settings.namespace, [stray, good])
    worker = fleet.worker("--concurrency", "8", env=env)

    await wait_until(
        lambda: count_rows(settings.database_url, "dead_letters", "source = 'ghost'"),
        60,
        message="the stray event as a dead letter",
    )
    assert await count_rows(settings.database_url, "dead_letters", "errors -> -1 ->> 'type' = 'UnknownSource'") == 1
    # the good one, not blocked: its commit may land just after the stray's dead letter
    await wait_until(lambda: count_rows(settings.database_url, "inbox"), 30, message="the good event's inbox row")
    assert await count_rows(settings.database_url, "inbox") == 1
    assert "unknown_source_waiting" not in worker.output()
