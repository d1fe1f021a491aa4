"""Paused sources (docs/reference.md §8.3): an operator pauses a source
during a migration or an outage downstream; its events are still accepted
(200) and kept, parked by the workers in `NS.paused.<source>`, and processed
once it is resumed, oldest first. The state is a row in Postgres (it
survives restarts; workers read it every second), and every pause and
resume is in the audit log. The console, the admin API and
`webhook-ingest sources` share this store."""

import contextlib

import asyncpg

from webhook_ingest.shared.audit import Actor, record_audit
from webhook_ingest.shared.db import load_queries, one_of

SQL = load_queries("webhook_ingest.shared.sources")

ACQUIRE_TIMEOUT = 5.0


class PauseStore:
    def __init__(self, database: asyncpg.Pool | asyncpg.Connection):
        self._database = database

    def _connection(self) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]:
        return one_of(self._database, ACQUIRE_TIMEOUT)

    async def paused(self) -> dict[str, dict]:
        """Each paused source: when and by whom."""
        async with self._connection() as connection:
            return {row["source"]: dict(row) for row in await connection.fetch(SQL["paused_sources"], timeout=5)}

    async def pause(self, source: str, actor: Actor) -> bool:
        """False when it was paused already."""
        return await self._change(source, actor, SQL["pause_source"], "pause_source")

    async def resume(self, source: str, actor: Actor) -> bool:
        """False when it was not paused."""
        return await self._change(source, actor, SQL["resume_source"], "resume_source")

    async def _change(self, source: str, actor: Actor, statement: str, action: str) -> bool:
        async with self._connection() as connection, connection.transaction():
            changed = await connection.fetchval(statement, source, str(actor)) is not None
            if changed:
                await record_audit(connection, actor, action, [], {"source": source})
        return changed
