"""Adversary round on issue 35's connection budget (branch adv35)."""

import asyncio

import asyncpg
import pytest

from tests.support import pgbouncer
from tests.support.events import make_event, publish_events
from tests.support.exactly_once import write_sources
from tests.support.processes import count_rows, wait_until
from webhook_ingest.shared.pooler import TransactionPooler, refuse_transaction_pooling

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
        settings, fleet, tmp_path, effects_tables,
        downstream):
    """Two default workers (8 connections: 4 transactions, 2 statements, 1
    renewal), 256 in flight each, a backlog of handlers that hold their
    transaction across a 300 ms call, a quarter of them dead letters on the
    statement pool: each key is POSTed once, no lease is lost."""
    sources = write_sources(tmp_path / "s.toml", "tests.support.handlers:writes_calls_then_fails_some",
                            url=downstream.url)
    events = [make_event("acme", f"evt_{n}") for n in range(BURST)]
    await publish_events(settings.amqp_url, settings.namespace, events)
    workers = [fleet.worker(env={"WEBHOOK_INGEST_SOURCES": sources}) for _ in range(2)]
    dead = [event for event in events if int(event.event_id.rsplit("_", 1)[1]) % 4 == 0]

    async def settled() -> bool:
        return (await count_rows(settings.database_url, "processed_events")
                + await count_rows(settings.database_url, "dead_letters")) >= BURST

    await wait_until(settled, 600, interval=1, message=f"{BURST} events settled")
    logs = "".join(worker.output() for worker in workers)
    assert downstream.posts == {event.key: 1 for event in events}
    assert await count_rows(settings.database_url, "dead_letters") == len(dead)
    assert [word for word in ("processing_lock_lost", "lease_lost_handler_cancelled", "event_deferred",
                              "event_retry_scheduled") if word in logs] == []
