"""What the ordering tests that run a real `Processor` share: a pool on the
test's own database with the module's `RUNS_TABLE` (where its handler
records each run) made, and the Redis claims of the test's namespace."""

import asyncpg
import pytest

from tests.conftest import REDIS_URL
from webhook_ingest.workers.claim.idempotency import IdempotencyStore


@pytest.fixture
async def pool(database, request):
    pool = await asyncpg.create_pool(database, min_size=1, max_size=6)
    runs_table = getattr(request.module, "RUNS_TABLE", None)
    if runs_table:
        await pool.execute(runs_table)
    yield pool
    await pool.close()


@pytest.fixture
async def claims(namespace, redis_cleanup):
    store = IdempotencyStore((REDIS_URL,), namespace, lock_ttl=30, done_ttl=60)
    yield store
    await store.close()
