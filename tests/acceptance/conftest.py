"""Fixtures for tests that run real `webhook-ingest` processes."""

import asyncpg
import pytest

from tests.support.handlers import EFFECTS_TABLES


@pytest.fixture
async def effects_tables(database):
    """The tables the counting handlers of tests.support.handlers write to."""
    connection = await asyncpg.connect(database)
    try:
        await connection.execute(EFFECTS_TABLES)
    finally:
        await connection.close()
