"""Ten workers and two ingress processes at their defaults fit a stock
Postgres (issue 35, requirement 4 and finding 6): each process keeps to its
connection budget, so the server never refuses one of their sessions,
whatever the handler — here one that holds its `ctx.db` transaction open
for 300 ms, the longest a connection stays taken.

The server is the test's own (tests/support/private_postgres.py), with
Postgres's default max_connections of 100, 3 of them kept for superusers;
the deployment connects as a role that is not one. The events are a
backlog waiting when the workers start, as after a deploy or an outage."""

import functools

import aiohttp
import asyncpg

from tests.support import private_postgres
from tests.support.events import make_event, publish_events
from tests.support.exactly_once import write_sources
from tests.support.processes import wait_until

WORKERS = 10
INGRESS_PROCESSES = 2
EVENTS = 1000
SETTLED = "SELECT (SELECT count(*) FROM processed_events) + (SELECT count(*) FROM dead_letters)"
REFUSED = ("too many clients", "TooManyConnections", "postgres_session_refused", "remaining connection slots")


async def _answering(url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as session, session.get(f"{url}/healthz") as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


async def test_ten_workers_and_two_ingress_fit_a_stock_postgres(settings, fleet, tmp_path, stock_postgres):
    sources = write_sources(tmp_path / "s.toml", "tests.support.handlers:writes_then_waits")
    env = {"WEBHOOK_INGEST_SOURCES": sources, "DATABASE_URL": stock_postgres.app_url}
    events = [make_event("acme", f"evt_{n}") for n in range(EVENTS)]
    await publish_events(settings.amqp_url, settings.namespace, events)  # a backlog

    ingresses = [fleet.ingress(env=env) for _ in range(INGRESS_PROCESSES)]
    workers = [fleet.worker(env=env) for _ in range(WORKERS)]
    for _, url in ingresses:
        await wait_until(functools.partial(_answering, url), 120, interval=0.5, message=f"{url} answering")

    # as a superuser: a session the deployment's role cannot take from it
    admin = await asyncpg.connect(stock_postgres.app_url.replace(private_postgres.APP_ROLE, "postgres", 1))
    try:

        async def settled() -> bool:  # each event completed or dead-lettered
            return await admin.fetchval(SETTLED) >= EVENTS

        await wait_until(settled, 180, interval=0.5, message=f"{EVENTS} events settled")
        effects = await admin.fetch("SELECT key, count(*) AS runs FROM effects GROUP BY key")
        attempts = await admin.fetch("SELECT DISTINCT attempts FROM processed_events")
        dead = await admin.fetchval("SELECT count(*) FROM dead_letters")
    finally:
        await admin.close()

    logs = stock_postgres.log() + "".join(process.output() for process in [*workers, *(p for p, _ in ingresses)])
    assert [word for word in REFUSED if word in logs] == []
    assert {row["key"]: row["runs"] for row in effects} == {event.key: 1 for event in events}
    assert dead == 0
    assert [row["attempts"] for row in attempts] == [1]
    assert "event_retry_scheduled" not in logs
