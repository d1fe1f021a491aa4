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
mode, gives each client session a server process of its own, for
the session's whole life); nor does one session's server process change
between two of its statements, as it does behind a pooler that hands its
idle servers round robin.
"""

import asyncpg

from webhook_ingest.shared.errors import ConfigError

LOOKS = 3  # a busy pooler may hand the second session another server session: look again


class TransactionPooler(ConfigError):
    """A pooler in transaction (or statement) mode is between this process and Postgres."""


async def refuse_transaction_pooling(database_url: str) -> None:
    """TransactionPooler when a server process is handed between sessions
    (`_handed_between_clients`); the
    connection errors of asyncpg.connect while Postgres is away."""
    first = await asyncpg.connect(database_url, statement_cache_size=0)
    try:
        second = await asyncpg.connect(database_url, statement_cache_size=0)
        try:
            for _ in range(LOOKS):
                if await _handed_between_clients(first, second):
                    raise TransactionPooler(
                        "DATABASE_URL reaches Postgres through a pooler in transaction mode (its server processes"
                        " are handed between sessions): use session pooling (PgBouncer pool_mode = session) or connect"
                        ' directly; docs/operations.md, "Postgres connections"'
                    )
        finally:
            await second.close()
    finally:
        await first.close()


async def _handed_between_clients(first: asyncpg.Connection, second: asyncpg.Connection) -> bool:
    """One session's server process changes between two statements (a pooler
    handing its idle servers round robin, PgBouncer's `server_round_robin`),
    or two sessions share one (a pooler handing the last one used, its default)."""
    server = await _server_process(first)
    return server != await _server_process(first) or server == await _server_process(second)


async def _server_process(connection: asyncpg.Connection) -> int:
    return await connection.fetchval("SELECT pg_backend_pid()")
