"""Adversary round on issue 35's connection budget (branch adv35)."""

import asyncio

import asyncpg
import pytest

from tests.support import pgbouncer
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
