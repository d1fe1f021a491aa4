"""Fixtures shared by the integration tests."""

from datetime import timedelta

import asyncpg
import pytest

from webhook_ingest.shared.archive.store import ArchiveStore

ARCHIVED_SOURCES = ("acme", "routed")


@pytest.fixture
async def archive_store(database):
    """The archive's store on one connection of this test's database, with
    the days of acme and routed made (a week's retention)."""
    connection = await asyncpg.connect(database)
    store = ArchiveStore(connection)
    await store.keep({source: timedelta(days=7) for source in ARCHIVED_SOURCES})
    yield store
    await connection.close()
