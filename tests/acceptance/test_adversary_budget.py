"""Adversary round on issue 35's connection budget (branch adv35)."""

import asyncio

import asyncpg
import pytest

from tests.acceptance import test_connection_refusals
from tests.support import pgbouncer
from tests.support.events import make_event, publish_events
from tests.support.exactly_once import write_sources
from tests.support.processes import count_rows, wait_for_output, wait_until
from webhook_ingest.shared.db.pooler import TransactionPooler, refuse_transaction_pooling

limited_role = test_connection_refusals.limited_role  # a login role whose connection limit the test sets
WARM_SERVERS = 3  # server sessions idle in the pooler, as in front of any deployment under traffic


async def _warm(url: str, servers: int) -> None:
    """Leaves `servers` server sessions idle in the pooler: as many clients' statements at once."""
    clients = [await asyncpg.connect(url, statement_cache_size=0) for _ in range(servers)]
    try:
        await asyncio.gather(*(client.execute("SELECT pg_sleep(0.3)") for client in clients))
    finally:
        for client in clients:
            await client.close()


async def test_transaction_pooling_with_round_robin_servers_is_refused(stock_postgres):
    with pgbouncer.running(stock_postgres, "transaction", more="server_round_robin = 1\n") as url:
        await _warm(url, WARM_SERVERS)
        with pytest.raises(TransactionPooler):
            await refuse_transaction_pooling(url)


async def test_transaction_pooling_with_idle_servers_is_refused(stock_postgres):
    """The same with PgBouncer's default (LIFO) server order: refused."""
    with pgbouncer.running(stock_postgres, "transaction") as url:
        await _warm(url, WARM_SERVERS)
        with pytest.raises(TransactionPooler):
            await refuse_transaction_pooling(url)


BURST = 800


async def test_a_burst_of_slow_transactions_and_dead_letters_runs_each_call_once(
    settings, fleet, tmp_path, effects_tables, downstream
):
    """Two default workers (8 connections: 4 transactions, 2 statements, 1
    renewal), 256 in flight each, a backlog of handlers that hold their
    transaction across a 300 ms call, a quarter of them dead letters on the
    statement pool: each key is POSTed once, no lease is lost."""
    sources = write_sources(
        tmp_path / "s.toml", "tests.support.handlers:writes_calls_then_fails_some", url=downstream.url
    )
    events = [make_event("acme", f"evt_{n}") for n in range(BURST)]
    await publish_events(settings.amqp_url, settings.namespace, events)
    workers = [fleet.worker(env={"WEBHOOK_INGEST_SOURCES": sources}) for _ in range(2)]
    dead = [event for event in events if int(event.event_id.rsplit("_", 1)[1]) % 4 == 0]

    async def settled() -> bool:
        return (
            await count_rows(settings.database_url, "processed_events")
            + await count_rows(settings.database_url, "dead_letters")
        ) >= BURST

    await wait_until(settled, 600, interval=1, message=f"{BURST} events settled")
    logs = "".join(worker.output() for worker in workers)
    assert downstream.posts == {event.key: 1 for event in events}
    assert await count_rows(settings.database_url, "dead_letters") == len(dead)
    assert [
        word
        for word in ("processing_lock_lost", "lease_lost_handler_cancelled", "event_deferred", "event_retry_scheduled")
        if word in logs
    ] == []


IN_FLIGHT = 10
RENEWAL_SESSION = (
    "SELECT pid FROM pg_stat_activity WHERE usename = $1 AND query LIKE '%lease_until = clock_timestamp()%'"
)


async def test_a_dropped_renewal_session_on_a_full_server_repeats_no_call(
    settings, fleet, tmp_path, database, limited_role, downstream
):
    """Ten calls in flight (8 s each) under valid leases; the server is full
    for the worker's role (as at its max_connections: the shipped manifests
    at 10 worker pods, a rollout's surge) and the worker's one renewal
    session ends (a TCP reset, a renewal that timed out and was closed, an
    operator's pg_terminate_backend). Postgres answers throughout and no one
    else takes a key: a refused session is an outage, not a lost lease."""
    role, role_url = limited_role
    sources = write_sources(tmp_path / "s.toml", "forward", url=downstream.url + "?latency=8")
    worker = fleet.worker(env={"WEBHOOK_INGEST_SOURCES": sources, "DATABASE_URL": role_url})
    await wait_for_output(worker, "worker_consuming")
    events = [make_event("acme", f"evt_{n}") for n in range(IN_FLIGHT)]
    await publish_events(settings.amqp_url, settings.namespace, events)
    admin = await asyncpg.connect(database)
    try:

        async def all_calling() -> bool:
            return len(downstream.posts) == IN_FLIGHT and await admin.fetchval(RENEWAL_SESSION, role) is not None

        await wait_until(all_calling, 60, message="every call in flight, leases renewed")
        held = await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE usename = $1", role)
        await admin.execute(f'ALTER ROLE "{role}" CONNECTION LIMIT {held - 1}')  # full once the session ends
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = ANY($1::int[])",
            [row["pid"] for row in await admin.fetch(RENEWAL_SESSION, role)],
        )
        await asyncio.sleep(4)  # the server stays full a few seconds, more than a lease's TTL
        await admin.execute(f'ALTER ROLE "{role}" CONNECTION LIMIT -1')

        async def settled() -> bool:
            return await count_rows(database, "processed_events") >= IN_FLIGHT

        await wait_until(settled, 120, message=f"{IN_FLIGHT} completions")
    finally:
        await admin.close()
    assert downstream.posts == {event.key: 1 for event in events}
    assert "lease_lost_handler_cancelled" not in worker.output()


async def test_a_refused_completion_session_repeats_no_call(
    settings, fleet, tmp_path, database, limited_role, downstream
):
    """Ten calls in flight (3 s each) under valid leases; the server is full
    for the worker's role and every session but the renewal one ends (as a
    pool's session idle past asyncpg's 300 s is closed and reopened on the
    next burst, or a TCP reset): the leases stay renewed, but each
    completion needs a new statement session, refused until the server has
    room again 3 s after the calls ended. No one else took a key."""
    role, role_url = limited_role
    sources = write_sources(tmp_path / "s.toml", "forward", url=downstream.url + "?latency=3")
    worker = fleet.worker(env={"WEBHOOK_INGEST_SOURCES": sources, "DATABASE_URL": role_url})
    await wait_for_output(worker, "worker_consuming")
    events = [make_event("acme", f"evt_{n}") for n in range(IN_FLIGHT)]
    await publish_events(settings.amqp_url, settings.namespace, events)
    admin = await asyncpg.connect(database)
    try:

        async def all_calling() -> bool:
            return len(downstream.posts) == IN_FLIGHT and await admin.fetchval(RENEWAL_SESSION, role) is not None

        await wait_until(all_calling, 60, message="every call in flight, leases renewed")
        renewal = await admin.fetchval(RENEWAL_SESSION, role)
        others = [
            row["pid"]
            for row in await admin.fetch(
                "SELECT pid FROM pg_stat_activity WHERE usename = $1 AND pid <> $2", role, renewal
            )
        ]
        await admin.execute(f'ALTER ROLE "{role}" CONNECTION LIMIT 1')  # the renewal session alone
        await admin.execute("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid", others)
        await asyncio.sleep(6)  # the calls end meanwhile; the server stays full 3 s longer
        await admin.execute(f'ALTER ROLE "{role}" CONNECTION LIMIT -1')

        async def settled() -> bool:
            return await count_rows(database, "processed_events") >= IN_FLIGHT

        await wait_until(settled, 120, message=f"{IN_FLIGHT} completions")
    finally:
        await admin.close()
    assert downstream.posts == {event.key: 1 for event in events}
