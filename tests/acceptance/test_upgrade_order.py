"""Rolling out against a database whose migrations lag the release (docs/
operations.md, "Upgrading": migrate first). A worker of this release
against a schema before migration 0020 (processed_events without
`arrival`): real worker process, real Postgres and broker."""

import asyncpg
import pytest

from tests.support.events import make_event, publish_events
from tests.support.exactly_once import recorded_runs, write_sources
from tests.support.processes import wait_until
from webhook_ingest.shared.db import schema

pytestmark = pytest.mark.usefixtures("effects_tables")


async def schema_before_0020(database_url: str) -> None:
    """The database as `migrate` of the previous release left it: 0019 the last."""
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute("ALTER TABLE processed_events DROP COLUMN arrival")
        await connection.execute("DELETE FROM schema_migrations WHERE name = '0020_completion_arrival.sql'")
    finally:
        await connection.close()


async def test_a_worker_before_migration_0020_refuses_before_running_a_handler(settings, fleet, tmp_path):
    """A release rolled out before its migration: the worker must not run a
    handler it cannot complete (each run an effect, none recorded)."""
    await schema_before_0020(settings.database_url)
    env = {
        "WEBHOOK_INGEST_SOURCES": write_sources(
            tmp_path / "s.toml", "tests.support.handlers:external_effect", database_url=settings.database_url
        )
    }
    worker = fleet.worker("--concurrency", "1", env=env)
    await publish_events(settings.amqp_url, settings.namespace, [make_event("acme", "evt_early")])

    async def exited():
        return worker.popen.poll() is not None

    try:
        await wait_until(exited, 30, message="the worker refusing the schema")
        assert worker.popen.returncode != 0
        assert "0020_completion_arrival" in worker.output() and "migrate" in worker.output()
    finally:
        assert await recorded_runs(settings.database_url) == []  # no handler ran on a schema it cannot complete on


async def test_a_database_ahead_of_the_release_is_not_refused(database):
    """`migrate` of the next release ran while this one still works: the
    previous release runs on the new schema (docs/operations.md, "Upgrading")."""
    connection = await asyncpg.connect(database)
    try:
        await connection.execute("INSERT INTO schema_migrations (name) VALUES ('9999_the_next_release.sql')")
        await schema.require_migrations(connection)
        await connection.execute("DELETE FROM schema_migrations WHERE name = '0020_completion_arrival.sql'")
        with pytest.raises(schema.SchemaBehind, match=r"0020_completion_arrival\.sql"):
            await schema.require_migrations(connection)
    finally:
        await connection.close()
