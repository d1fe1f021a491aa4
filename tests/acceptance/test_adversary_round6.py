"""Adversary, round 6: pausing a source (fbeac3f) and incidents (fee867c,
db4070f), read as an attacker of the guarantees and checked against real
worker processes and the real services. A test marked xfail(strict) is a
finding not fixed yet: it fails on purpose, and the suite says so once it
passes.
"""

import asyncpg
import pytest

from tests.support.events import make_event, publish_events
from tests.support.exactly_once import recorded_runs, write_sources
from tests.support.processes import count_rows, wait_for_output, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("effects_tables")]
ROUND6 = "tests.support.adversary_round6_handlers"
DELIVERY_LIMIT = 2  # what a message that crashes the worker goes round, kept short here


async def _dead_letter_errors(database_url: str) -> list[str]:
    connection = await asyncpg.connect(database_url)
    try:
        return [row["type"] for row in await connection.fetch(
            "SELECT errors -> -1 ->> 'type' AS type FROM dead_letters ORDER BY id")]
    finally:
        await connection.close()


async def test_a_permanent_failure_quoting_a_nul_is_dead_lettered_after_one_run(settings, fleet, tmp_path):
    """§8: a PermanentError is a dead letter at once, its error kept — and
    dead_letters.py's `jsonb` keeps any string an error holds ("a lone
    surrogate or NUL becomes U+FFFD"), so that a dead letter can always be
    recorded. Finding R6-1: the incident's count (fee867c), in the same
    transaction, wrote the message as text, which Postgres refused; the dead
    letter was not committed, and the handler — a call to the outside
    world — ran again, once per delivery our own count allows (3 runs at
    limit 2, 21 at the default), the event ending as DeliveryLimitExceeded."""
    await _dead_lettered_after_one_run(settings, fleet, tmp_path, "refused_quoting_a_nul")


async def test_a_permanent_failure_quoting_a_lone_surrogate_is_dead_lettered_after_one_run(
        settings, fleet, tmp_path):
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
    worker = fleet.worker("--concurrency", "2", env={
        "WEBHOOK_INGEST_SOURCES": sources, "WEBHOOK_INGEST_DELIVERY_LIMIT": str(DELIVERY_LIMIT)})
    await wait_for_output(worker, "worker_consuming")
    await publish_events(settings.amqp_url, settings.namespace, [make_event("acme", "evt_unstorable")],
                         delivery_limit=DELIVERY_LIMIT)

    await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 60, message="the dead letter")
    attempts = [run["started"] for run in await recorded_runs(settings.database_url)]
    assert (attempts, await _dead_letter_errors(settings.database_url)) == ([1.0], ["PermanentError"])
    assert await count_rows(settings.database_url, "incidents", "dead_letters = 1") == 1
