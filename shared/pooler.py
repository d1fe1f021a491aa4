"""A pooler in transaction mode in front of Postgres is refused at start
(docs/operations.md, "Postgres connections"; PgBouncer's `pool_mode =
transaction` or `statement`).

The workers and the ingress rely on what such a pooler takes away: asyncpg
prepares and caches each statement on its session, the workers' sessions
`SET` the server's TCP keepalives (what frees a cut-off worker's turn,
docs/design.md, "Exclusion") and the archive's upkeep its `lock_timeout`,
and `migrate` holds a session's advisory lock. Behind transaction pooling a
prepared statement is missing on the next server session, and a `SET`
lands on a server session another client gets next. Rather than fail at
random later, a process looks once: two sessions of its own that report
the same server process are one server session handed between clients,
which only such a pooler does (Postgres itself, or a pooler in session
mode, gives each client session a server process of its own).
"""

import asyncpg

from webhook_ingest.shared.errors import ConfigError

LOOKS = 3  # a busy pooler may hand the second session another server session: look again


class TransactionPooler(ConfigError):
    """A pooler in transaction (or statement) mode is between this process and Postgres."""


async def refuse_transaction_pooling(database_url: str) -> None:
    """TransactionPooler when two sessions share a server process; the
    connection errors of asyncpg.connect while Postgres is away."""
    first = await asyncpg.connect(database_url, statement_cache_size=0)
    try:
        second = await asyncpg.connect(database_url, statement_cache_size=0)
        try:
            for _ in range(LOOKS):
                if await _server_process(first) == await _server_process(second):
                    raise TransactionPooler(
                        "DATABASE_URL reaches Postgres through a pooler in transaction mode (two sessions share"
                        " one server process): use session pooling (PgBouncer pool_mode = session) or connect"
                        " directly; docs/operations.md, \"Postgres connections\"")
        finally:
            await second.close()
    finally:
        await first.close()


async def _server_process(connection: asyncpg.Connection) -> int:
    return await connection.fetchval("SELECT pg_backend_pid()")
