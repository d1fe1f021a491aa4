"""PgBouncer in front of Postgres (issue 35, requirement 4): in session mode
the workers run as without it; in transaction mode a worker and an ingress
refuse to start, with the reason in one line, rather than fail later
(shared/db/pooler.py says what such a pooler would break)."""

import asyncpg

from tests.support import pgbouncer
from tests.support.events import make_event, publish_events
from tests.support.exactly_once import write_sources
from tests.support.processes import wait_until

EVENTS = 200
REASON = "pooler in transaction mode"


async def test_transaction_pooling_is_refused_at_start(fleet, tmp_path, stock_postgres):
    sources = write_sources(tmp_path / "s.toml", "tests.support.handlers:writes_then_waits")
    with pgbouncer.running(stock_postgres, "transaction") as pooled_url:
        env = {"WEBHOOK_INGEST_SOURCES": sources, "DATABASE_URL": pooled_url}
        worker = fleet.worker(env=env)
        ingress, _ = fleet.ingress(env=env)
        assert worker.popen.wait(timeout=60) == 2
        assert ingress.popen.wait(timeout=60) == 2
    for process in (worker, ingress):
        assert REASON in process.output()
        assert "Traceback" not in process.output()


async def test_session_pooling_runs_every_event_once(settings, fleet, tmp_path, stock_postgres):
    sources = write_sources(tmp_path / "s.toml", "tests.support.handlers:writes_then_waits")
    events = [make_event("acme", f"evt_{n}") for n in range(EVENTS)]
    await publish_events(settings.amqp_url, settings.namespace, events)
    with pgbouncer.running(stock_postgres, "session") as pooled_url:
        env = {"WEBHOOK_INGEST_SOURCES": sources, "DATABASE_URL": pooled_url}
        workers = [fleet.worker(env=env) for _ in range(2)]
        admin = await asyncpg.connect(stock_postgres.app_url)
        try:

            async def completed() -> bool:
                return await admin.fetchval("SELECT count(*) FROM processed_events") >= EVENTS

            await wait_until(completed, 120, interval=0.5, message=f"{EVENTS} completions")
            effects = await admin.fetch("SELECT key, count(*) AS runs FROM effects GROUP BY key")
            dead = await admin.fetchval("SELECT count(*) FROM dead_letters")
        finally:
            await admin.close()
    assert {row["key"]: row["runs"] for row in effects} == {event.key: 1 for event in events}
    assert dead == 0
    assert all("event_retry_scheduled" not in worker.output() for worker in workers)
