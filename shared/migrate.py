"""`webhook-ingest migrate`: create the database if missing, apply numbered
SQL migrations once each.

Each migration runs in its own transaction together with its row in
`schema_migrations`, under a session advisory lock, so two processes
migrating at once apply every file exactly once.
"""

import importlib.resources
from urllib.parse import urlsplit, urlunsplit

import asyncpg

_MIGRATION_LOCK = 0x77686b6d  # any constant shared by every migrating process


async def migrate(database_url: str) -> list[str]:
    """Returns the names of the migrations applied now (empty when up to date)."""
    await create_database_if_missing(database_url)
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK)
        await connection.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations"
            " (name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        applied = {row["name"] for row in await connection.fetch("SELECT name FROM schema_migrations")}
        pending = [(name, sql) for name, sql in migrations() if name not in applied]
        for name, sql in pending:
            async with connection.transaction():
                await connection.execute(sql)
                await connection.execute("INSERT INTO schema_migrations (name) VALUES ($1)", name)
        return [name for name, _ in pending]
    finally:
        await connection.close()


def migrations() -> list[tuple[str, str]]:
    folder = importlib.resources.files("webhook_ingest.shared").joinpath("migrations")
    files = sorted((f for f in folder.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)
    return [(f.name, f.read_text()) for f in files]


async def create_database_if_missing(database_url: str) -> None:
    parts = urlsplit(database_url)
    name = parts.path.lstrip("/")
    maintenance_url = urlunsplit(parts._replace(path="/postgres"))
    connection = await asyncpg.connect(maintenance_url)
    try:
        # Two processes creating the same database race inside the catalog
        # (a unique violation, not DuplicateDatabaseError): take turns.
        await connection.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK)
        exists = await connection.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name)
        if not exists:
            await connection.execute(f'CREATE DATABASE "{_identifier(name)}"')
    finally:
        await connection.close()


def _identifier(name: str) -> str:
    return name.replace('"', '""')
