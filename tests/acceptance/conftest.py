"""Fixtures for tests that run real `webhook-ingest` processes."""

import asyncpg
import pytest

from tests.support import downstream as downstream_server
from tests.support.handlers import EFFECTS_TABLES


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
