"""The incident store: the workers' one write (`record_failure`), and reading
incidents and acting on them — what `webhook-ingest incidents`, the admin
API and the console share (docs/oncall.md, "Incidents").

What a row means and how failures are grouped is `shared/incidents/model.py`.
Every state change is written to `incident_changes` in the transaction that
makes it: the incident's history, and what notifications are sent from.
"""

import asyncio
import contextlib
from dataclasses import dataclass

import asyncpg

from webhook_ingest.shared.db import load_queries, one_of, raise_if_cancelled
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.observability import get_logger, metrics
from webhook_ingest.shared.storable_text import storable

from .model import Fingerprint

SQL = load_queries("webhook_ingest.shared.incidents")

log = get_logger(__name__)

STATES = ("open", "acknowledged", "resolved")
LAST_ERROR_CHARS = 2000
ACQUIRE_TIMEOUT = 5.0
# How long a failure's count waits for its incident's row: a few concurrent
# counts of one incident take milliseconds each; past this, the count is skipped.
INCIDENT_LOCK_TIMEOUT = "200ms"
RESOLVER_SECONDS = 30.0  # how often a worker looks for quiet incidents


@dataclass(frozen=True)
class Failure:
    """One failed attempt (or a dead letter) of one event."""

    source: str
    handler: str
    key: str
    event_id: str
    attempt: int
    error_type: str
    message: str
    dead_letter_id: int | None = None


async def record_failure(connection: asyncpg.Connection, failure: Failure, timeout: float | None = None) -> int:
    """Counts `failure` in its incident, opening or reopening it; in the
    caller's transaction, so a dead letter and its count commit together.
    The incident's id. The error's text is made storable first: a NUL or a
    lone surrogate in it must not refuse the dead letter it commits with.
    Its incident's row held elsewhere past INCIDENT_LOCK_TIMEOUT (a
    partitioned worker's transaction keeps it ~25 s) raises asyncpg's
    LockNotAvailableError: the callers skip the count rather than hold a
    connection and the dead letter's commit (adversary round 6, R6-5)."""
    error_type, message = storable(failure.error_type), storable(failure.message)
    fingerprint = Fingerprint.of(error_type, message)
    async with connection.transaction():  # a savepoint inside the caller's
        await connection.execute(SQL["incident_lock_timeout"], INCIDENT_LOCK_TIMEOUT, timeout=timeout)
        new_dead_letter = failure.dead_letter_id is not None and not await connection.fetchval(
            SQL["dead_letter_counted"],
            failure.dead_letter_id,
            failure.source,
            failure.handler,
            fingerprint.digest,
            timeout=timeout,
        )
        row = await connection.fetchrow(
            SQL["count_failure_in_incident"],
            failure.source,
            failure.handler,
            fingerprint.digest,
            error_type,
            fingerprint.pattern,
            message[:LAST_ERROR_CHARS],
            int(new_dead_letter),
            timeout=timeout,
        )
        await connection.execute(
            SQL["count_incident_event"],
            row["id"],
            failure.key,
            failure.event_id,
            failure.attempt,
            failure.dead_letter_id,
            timeout=timeout,
        )
        if row["change"] is not None:
            await connection.execute(
                SQL["record_incident_change"], row["id"], row["change"], "failure", timeout=timeout
            )
            log.warning(
                "incident_opened",
                incident_id=row["id"],
                source=failure.source,
                handler=failure.handler,
                error_type=error_type,
                pattern=fingerprint.pattern[:200],
            )
    return row["id"]


class IncidentNotFound(LookupError):
    pass


class IncidentStore:
    def __init__(self, database: asyncpg.Pool | asyncpg.Connection):
        self._database = database  # a pool (ingress, workers), or the CLI's one connection

    def _connection(self) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]:
        return one_of(self._database, ACQUIRE_TIMEOUT)

    # -- reading ---------------------------------------------------------------

    async def newest_first(self, state: str | None = None, limit: int = 100) -> list[dict]:
        """Unresolved first, then by last failure; `state` None: every state."""
        async with self._connection() as connection:
            return [dict(row) for row in await connection.fetch(SQL["list_incidents"], state, limit)]

    async def get(self, incident_id: int) -> dict:
        async with self._connection() as connection:
            row = await connection.fetchrow(SQL["get_incident"], incident_id)
        if row is None:
            raise IncidentNotFound(incident_id)
        return dict(row)

    async def events(self, incident_id: int, limit: int = 200) -> list[dict]:
        async with self._connection() as connection:
            return [dict(row) for row in await connection.fetch(SQL["incident_events"], incident_id, limit)]

    async def history(self, incident_id: int) -> list[dict]:
        async with self._connection() as connection:
            return [dict(row) for row in await connection.fetch(SQL["incident_history"], incident_id)]

    async def open_dead_letter_ids(self, incident_id: int) -> list[int]:
        """The incident's dead letters still open: what "replay" or "discard" acts on."""
        async with self._connection() as connection:
            return [row[0] for row in await connection.fetch(SQL["open_dead_letters_of_incident"], incident_id)]

    async def unresolved_counts(self) -> dict[str, int]:
        async with self._connection() as connection:
            return dict(await connection.fetchrow(SQL["count_unresolved_incidents"]))

    # -- acting ----------------------------------------------------------------

    async def acknowledge(self, incident_id: int, actor: str) -> bool:
        """False when it was not open (acknowledged already, or resolved)."""
        return await self.change(incident_id, "acknowledged", actor)

    async def resolve(self, incident_id: int, actor: str) -> bool:
        """False when it was resolved already."""
        return await self.change(incident_id, "resolved", actor)

    async def change(self, incident_id: int, state: str, actor: str) -> bool:
        """To `state` (acknowledged or resolved) by `actor`; False when it was already."""
        async with self._connection() as connection, connection.transaction():
            changed = await connection.fetchval(SQL["change_incident_state"], incident_id, state, actor)
            if changed is None:
                if await connection.fetchval(SQL["get_incident"], incident_id) is None:
                    raise IncidentNotFound(incident_id)
                return False
            await connection.execute(SQL["record_incident_change"], incident_id, state, actor)
        log.info("incident_changed", incident_id=incident_id, state=state, actor=actor)
        return True

    async def resolve_quiet(self, quiet_seconds: float) -> list[int]:
        """Resolves the unresolved incidents without a failure for `quiet_seconds`."""
        async with self._connection() as connection, connection.transaction():
            ids = [row[0] for row in await connection.fetch(SQL["resolve_quiet_incidents"], quiet_seconds)]
            for incident_id in ids:
                await connection.execute(SQL["record_incident_change"], incident_id, "resolved", "auto")
        for incident_id in ids:
            log.info("incident_resolved", incident_id=incident_id, actor="auto", quiet_seconds=quiet_seconds)
        return ids

    async def keep_resolving(self, quiet_seconds: float, every: float = RESOLVER_SECONDS) -> None:
        """Forever (each worker runs it): resolves quiet incidents and keeps
        the `webhook_incidents_unresolved` gauge; a Postgres outage only delays it."""
        while True:
            try:
                await self.resolve_quiet(quiet_seconds)
                for state, count in (await self.unresolved_counts()).items():
                    metrics.incidents_unresolved.labels(state).set(count)
            except Exception as exc:  # noqa: BLE001 - a late resolution, never a dead task
                raise_if_cancelled()
                log.warning("incident_resolver_failed", error=describe(exc))
            await asyncio.sleep(every)
