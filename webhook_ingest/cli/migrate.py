"""`webhook-ingest migrate`: create the database if missing, apply numbered
SQL migrations once each (`shared/migrations/`: the schema ingress and
workers share).

Each migration runs in its own transaction together with its row in
`schema_migrations`, under a session advisory lock, so two processes
migrating at once apply every file exactly once.

The target database is connected to first: a managed Postgres often forbids
the `postgres` maintenance database, and a database that exists needs
nothing from it. Only when the target does not exist is the maintenance
database asked to create it.
"""

from urllib.parse import unquote, urlsplit, urlunsplit

import asyncpg

from webhook_ingest.shared.db import schema
from webhook_ingest.shared.errors import WebhookIngestError

_MIGRATION_LOCK = 0x77686B6D  # any constant shared by every migrating process
MAINTENANCE_DATABASE = "postgres"
CONNECT_TIMEOUT = 10.0


class DatabaseMissing(WebhookIngestError):
    """The database does not exist and cannot be created here."""


async def migrate(database_url: str) -> list[str]:
    """Returns the names of the migrations applied now (empty when up to date)."""
    connection = await connect_creating_if_missing(database_url)
    try:
        await connection.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK)
        await connection.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations"
            " (name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = await schema.applied(connection)
        pending = [(name, sql) for name, sql in migrations() if name not in done]
        for name, sql in pending:
            async with connection.transaction():
                await connection.execute(sql)
                await connection.execute("INSERT INTO schema_migrations (name) VALUES ($1)", name)
        return [name for name, _ in pending]
    finally:
        await connection.close()


def migrations() -> list[tuple[str, str]]:
    return [(f.name, f.read_text()) for f in schema.migration_files()]


async def connect_creating_if_missing(database_url: str) -> asyncpg.Connection:
    try:
        return await asyncpg.connect(database_url, timeout=CONNECT_TIMEOUT)
    except asyncpg.InvalidCatalogNameError:
        await create_database(database_url)
    return await asyncpg.connect(database_url, timeout=CONNECT_TIMEOUT)


async def create_database(database_url: str) -> None:
    """Create the database of `database_url` through the maintenance
    database; DatabaseMissing, saying what to do, when we may not."""
    parts = urlsplit(database_url)
    name = unquote(parts.path.lstrip("/"))
    cannot = f"database {name!r} does not exist and cannot be created here"
    advice = f'create it yourself (CREATE DATABASE "{_identifier(name)}"), then run migrate again'
    try:
        connection = await asyncpg.connect(
            urlunsplit(parts._replace(path=f"/{MAINTENANCE_DATABASE}")), timeout=CONNECT_TIMEOUT
        )
    except asyncpg.PostgresError as exc:
        raise DatabaseMissing(f"{cannot}: the {MAINTENANCE_DATABASE!r} database refused us ({exc}); {advice}") from exc
    try:
        # Two processes creating the same database race inside the catalog
        # (a unique violation, not DuplicateDatabaseError): take turns.
        await connection.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK)
        if not await connection.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            await connection.execute(f'CREATE DATABASE "{_identifier(name)}"')
    except asyncpg.InsufficientPrivilegeError as exc:
        raise DatabaseMissing(f"{cannot}: this user may not create databases ({exc}); {advice}") from exc
    finally:
        await connection.close()


def _identifier(name: str) -> str:
    return name.replace('"', '""')
