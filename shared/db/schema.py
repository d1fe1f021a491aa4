"""The schema this release needs: every migration it ships
(`shared/migrations/`) applied. A process of this release started before
`webhook-ingest migrate` ran refuses at once, naming what is missing,
instead of running handlers whose completions the old schema refuses
(docs/operations.md, "Upgrading": migrate first). A database ahead of the
release (the previous release still running after `migrate`) is fine."""

import importlib.resources
from importlib.resources.abc import Traversable

import asyncpg

from webhook_ingest.shared.errors import WebhookIngestError


def migration_files() -> list[Traversable]:
    """This release's migrations, in the order they apply (`webhook-ingest migrate` runs them)."""
    folder = importlib.resources.files("webhook_ingest.shared").joinpath("migrations")
    return sorted((f for f in folder.iterdir() if f.name.endswith(".sql")), key=lambda f: f.name)


# Read once, at import: the names are the release's, not the database's.
MIGRATIONS = [f.name for f in migration_files()]


class SchemaBehind(WebhookIngestError):
    """The database lacks migrations this release needs."""


async def require_migrations(database: asyncpg.Pool | asyncpg.Connection) -> None:
    """SchemaBehind unless every migration of this release is applied."""
    missing = await missing_migrations(database)
    if missing:
        raise SchemaBehind(
            f"the database lacks {len(missing)} migration(s) this release needs ({', '.join(missing)}):"
            " run `webhook-ingest migrate` first (docs/operations.md, Upgrading)"
        )


async def missing_migrations(database: asyncpg.Pool | asyncpg.Connection) -> list[str]:
    """This release's migrations the database has not applied; all of them before a first `migrate`."""
    if await database.fetchval("SELECT to_regclass('schema_migrations')") is None:
        return list(MIGRATIONS)
    done = await applied(database)
    return [name for name in MIGRATIONS if name not in done]


async def applied(database: asyncpg.Pool | asyncpg.Connection) -> set[str]:
    """The migrations the database records as applied (`schema_migrations` exists)."""
    return {row["name"] for row in await database.fetch("SELECT name FROM schema_migrations")}
