"""The audit log (`audit_log`, docs/reference.md §8): every replay and
discard of a dead letter, every pause and resume of a source, every bulk
action's and event replay's start, end and cancel, with who did it (an
`Actor`). Written in the transaction of the act it records when there is
one (`record_audit` on that connection); read newest first by the console.
"""

import contextlib
import json
from collections.abc import Sequence

import asyncpg

from webhook_ingest.shared.db import jsonb, load_queries, one_of

from .actor import Actor

SQL = load_queries("webhook_ingest.shared.audit")
ACQUIRE_TIMEOUT = 5.0


async def record_audit(
    connection: asyncpg.Connection, actor: Actor, action: str, ids: Sequence[int] = (), detail: dict | None = None
) -> int:
    """One entry, on `connection` (in its transaction, when it is in one): its id.
    `ids` are the dead letters it names, if any."""
    return await connection.fetchval(
        SQL["insert_audit"], actor.role, actor.name, actor.via, action, list(ids), jsonb(detail or {})
    )


class AuditLog:
    """The audit log over one asyncpg pool (the ingress) or one connection (the CLI)."""

    def __init__(self, database: asyncpg.Pool | asyncpg.Connection):
        self._database = database

    def _connection(self) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]:
        return one_of(self._database, ACQUIRE_TIMEOUT)

    async def record(self, actor: Actor, action: str, ids: Sequence[int] = (), detail: dict | None = None) -> int:
        """One entry, on a connection of its own: its id."""
        async with self._connection() as connection:
            return await record_audit(connection, actor, action, ids, detail)

    async def entries(
        self, dead_letter_id: int | None = None, before: int | None = None, limit: int = 100
    ) -> list[dict]:
        """The audit log, newest first; only entries naming `dead_letter_id` when given."""
        async with self._connection() as connection:
            rows = await connection.fetch(SQL["list_audit"], dead_letter_id, before, limit)
        return [dict(row) | {"detail": json.loads(row["detail"])} for row in rows]
