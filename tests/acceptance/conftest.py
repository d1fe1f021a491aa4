"""Fixtures for tests that run real `webhook-ingest` processes."""

import asyncpg
import pytest

from tests.support import downstream as downstream_server
from tests.support import private_postgres
from tests.support.handlers import EFFECTS_TABLES
from webhook_ingest.cli.migrate import migrate


@pytest.fixture
async def effects_tables(database):
    """The tables the counting handlers of tests.support.handlers write to."""
    connection = await asyncpg.connect(database)
    try:
        await connection.execute(EFFECTS_TABLES)
    finally:
        await connection.close()


@pytest.fixture
async def downstream():
    """A receiver answering 200 after 300 ms (or `?latency=`), counting calls per key (tests/support/downstream.py)."""
    async for serving in downstream_server.serving():
        yield serving


@pytest.fixture
async def stock_postgres():
    """A Postgres server of this test's own at Postgres's defaults
    (max_connections 100), its app database migrated, with the effects tables."""
    with private_postgres.running() as server:
        await migrate(server.app_url)
        connection = await asyncpg.connect(server.app_url)
        try:
            await connection.execute(EFFECTS_TABLES)
        finally:
            await connection.close()
        yield server
