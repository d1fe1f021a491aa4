"""Adversary round on routes (issue 23, item 3; docs/design.md "Routes"):
each (event, route) pair runs exactly once, independently, nothing lost —
attacked with real worker processes, RabbitMQ and Postgres."""

from dataclasses import replace
from datetime import timedelta

import asyncpg
import pytest

from webhook_ingest.shared import archive
from webhook_ingest.shared.archive_store import ArchiveStore
from webhook_ingest.shared.dead_letter_store import DeadLetterStore
from webhook_ingest.shared.dead_letters import record_dead_letter
from webhook_ingest.shared.routes import route_key
from webhook_ingest.shared.sources import load_sources
from tests.support.dead_letters import failure
from tests.support.events import make_event, publish_events
from tests.support.processes import count_rows, wait_until

pytestmark = pytest.mark.slow


async def _effects(database_url: str) -> dict[str, int]:
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch("SELECT key, count(*) AS runs FROM effects GROUP BY key")
    finally:
        await connection.close()
    return {row["key"]: row["runs"] for row in rows}


@pytest.mark.xfail(strict=True, reason=(
    "R1: a source named 'acme#billing' and source acme's route 'billing' share the handler key 'acme#billing'"
    " (workers/handlers.handler_key; a source name may hold '#'): load_handlers keeps the later one, so"
    " acme#billing's events run acme's billing route handler instead of their own — seen: its own handler"
    " (told to fail, max_attempts 1) never ran, no dead letter, effects {'acme#billing:evt_1': 1}"))
async def test_a_source_whose_name_holds_a_hash_runs_its_own_handler(
        service_env, settings, fleet, tmp_path, effects_tables):
    fail_file = tmp_path / "fail"
    fail_file.write_text("fail")
    sources = tmp_path / "sources.toml"
    sources.write_text(
        '[sources."acme#billing"]\n'
        'scheme = "hmac-sha256"\n'
        'secrets = ["s"]\n'
        "max_attempts = 1\n"
        'handler = "tests.support.route_handlers:fails_while_flagged"\n'
        f'handler_options = {{ fail_file = "{fail_file}" }}\n'
        "\n"
        "[sources.acme]\n"
        'scheme = "hmac-sha256"\n'
        'secrets = ["s"]\n'
        "\n"
        "[[sources.acme.routes]]\n"
        'name = "billing"\n'
        'handler = "tests.support.route_handlers:counted_route"\n'
    )
    load_sources(str(sources))  # the file is accepted as it is
    fleet.worker(env={**service_env, "WEBHOOK_INGEST_SOURCES": str(sources)})
    await publish_events(settings.amqp_url, settings.namespace, [make_event("acme#billing", "evt_1")])

    async def settled() -> bool:
        return (await count_rows(settings.database_url, "dead_letters")
                + await count_rows(settings.database_url, "processed_events")) > 0
    await wait_until(settled, 30, message="evt_1 settled")
    assert await _effects(settings.database_url) == {}  # its own handler failed: no effect
    assert await count_rows(settings.database_url, "dead_letters") == 1


@pytest.mark.xfail(strict=True, reason=(
    "R2: discarding a route's dead letter (key KEY#ROUTE) leaves the event's archived arrival 'dead':"
    " queries.sql archive_discarded matches event_archive.key = dead_letters.key, but the archive keeps a routed"
    " event under its own key KEY (workers/archive_notes.py strips #ROUTE) — seen: status 'dead' after the"
    " discard, where an unrouted event's reads 'discarded' (test_archive_outcomes)"))
async def test_discarding_a_routes_dead_letter_marks_the_events_archived_arrival_discarded(database):
    event = make_event("acme", "evt_d", {"type": "invoice.paid"})
    event = replace(event, received_at=round(event.received_at, 3))  # as the ingress stamps it: whole ms
    audit = replace(event, key=route_key(event.key, "audit"), route="audit")
    connection = await asyncpg.connect(database)
    try:
        store = ArchiveStore(connection)
        await store.keep({"acme": timedelta(days=7)})
        await store.write_arrivals([archive.arrival_row(event, "invoice.paid", "{}", archive.QUEUED)])
        # what workers/archive_notes.py writes for the route's dead letter: the event's own row
        await store.write_outcomes([archive.outcome_row(event, archive.DEAD, event.received_at, "route audit: boom")])
        dead_letter_id = await record_dead_letter(connection, audit, [failure(1)])
        await DeadLetterStore(connection).discard([dead_letter_id])
        status = await connection.fetchval("SELECT status FROM event_archive WHERE key = $1", event.key)
    finally:
        await connection.close()
    assert status == "discarded"
