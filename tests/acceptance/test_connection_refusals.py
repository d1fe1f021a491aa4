"""A Postgres that refuses a new session is an outage, never a handler's
failure (issue 35, finding 6): "sorry, too many clients already" spent an
attempt of every handler whose `ctx.db` asked for a connection the server
would not give, and a scaled-out deployment dead-lettered events whose
handlers never failed.

The worker connects as a role of its own whose connection limit is set, once
the worker is consuming, to the sessions it holds: every session it opens
after that is refused with the server's own error (SQLSTATE 53300, as when
max_connections is reached), while the ones it has go on working."""

import uuid

import asyncpg
import pytest

from tests.support.events import make_event, publish_events
from tests.support.exactly_once import assert_each_once, write_sources
from tests.support.processes import count_rows, wait_for_output, wait_until

EVENTS = 30


@pytest.fixture
async def limited_role(database, effects_tables):
    """A login role with every right on this test's database; yields its
    name and a database URL that connects as it."""
    role = f"wi_limited_{uuid.uuid4().hex[:12]}"
    connection = await asyncpg.connect(database)
    try:
        await connection.execute(f'CREATE ROLE "{role}" LOGIN')
        for grant in (
            "ALL ON ALL TABLES IN SCHEMA public",
            "ALL ON ALL SEQUENCES IN SCHEMA public",
            "ALL ON SCHEMA public",
        ):
            await connection.execute(f'GRANT {grant} TO "{role}"')
        yield role, database.replace("postgres@", f"{role}@", 1)
    finally:
        await connection.execute(f'ALTER ROLE "{role}" CONNECTION LIMIT -1')
        await connection.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
        await connection.execute(f'DROP OWNED BY "{role}"')
        await connection.execute(f'DROP ROLE "{role}"')
        await connection.close()


async def test_a_refused_connection_spends_no_attempt(settings, fleet, tmp_path, database, limited_role):
    role, role_url = limited_role
    sources = write_sources(tmp_path / "s.toml", "tests.support.handlers:writes_then_waits")
    worker = fleet.worker(env={"WEBHOOK_INGEST_SOURCES": sources, "DATABASE_URL": role_url})
    await wait_for_output(worker, "worker_consuming")
    admin = await asyncpg.connect(database)
    try:
        held = await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE usename = $1", role)
        await admin.execute(f'ALTER ROLE "{role}" CONNECTION LIMIT {held}')

        events = [make_event("acme", f"evt_{n}") for n in range(EVENTS)]
        await publish_events(settings.amqp_url, settings.namespace, events)

        async def settled() -> bool:  # each event completed or dead-lettered
            completed = await count_rows(database, "processed_events")
            return completed + await count_rows(database, "dead_letters") >= EVENTS

        await wait_until(settled, 90, message=f"{EVENTS} events settled")

        attempts = await admin.fetch("SELECT key, attempts FROM processed_events ORDER BY key")
    finally:
        await admin.close()
    assert "too many connections" in worker.output()  # the refusals this test is about did happen
    await assert_each_once(settings.database_url, events)  # none dead-lettered
    assert {row["attempts"] for row in attempts} == {1}
    assert "event_retry_scheduled" not in worker.output()
