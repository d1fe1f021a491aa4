"""Events in the archive as the ingress and the workers write them
(ArchiveStore's batches), for tests of the tools that read it."""

import dataclasses
import json
import time
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import asyncpg
import orjson

from tests.support.events import make_event
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.archive.store import ArchiveStore
from webhook_ingest.shared.event.message import EventMessage, new_arrival
from webhook_ingest.workers.claim.completions import CompletionStore


def archived_event(
    source: str,
    event_id: str,
    received: datetime,
    kind: str | None = "test.event",
    body: bytes | None = None,
    headers: dict | None = None,
    **payload,
) -> EventMessage:
    """An arrival at `received`: a JSON body {"id", "type", **payload}, or `body` as given."""
    made = make_event(source, event_id, {"type": kind, **payload})
    raw = body if body is not None else orjson.dumps({"id": event_id, "type": kind, **payload})
    return dataclasses.replace(
        made, body=raw, received_at=received.timestamp(), headers=headers if headers is not None else made.headers
    )


async def seed_archive(database_url: str, arrivals: Iterable[EventMessage], outcomes: Iterable[tuple] = ()) -> None:
    """The arrivals (status queued, their type the JSON body's `type`), then
    `archive.outcome_row`s; each source's days made first."""
    arrivals = list(arrivals)
    connection = await asyncpg.connect(database_url)
    try:
        store = ArchiveStore(connection)
        await store.keep({source: timedelta(days=7) for source in {event.source for event in arrivals}})
        await store.write_arrivals(
            [
                archive.arrival_row(event, _kind(event.body), json.dumps(event.headers), archive.QUEUED)
                for event in arrivals
            ]
        )
        if outcomes := list(outcomes):
            await store.write_outcomes(outcomes)
    finally:
        await connection.close()


def arrival_of(source: str, event_id: str, seconds_ago: float = 0, **payload) -> EventMessage:
    """An arrival of its own (a new arrival id), received `seconds_ago` in
    whole milliseconds, as a message carries it to a worker."""
    event = make_event(source, event_id, payload or None)
    received_ms = round((time.time() - seconds_ago) * 1000)
    return dataclasses.replace(event, arrival=new_arrival(), received_at=received_ms / 1000)


def minutes_ago(minutes: float) -> datetime:
    return datetime.now(UTC) - timedelta(minutes=minutes)


def _kind(body: bytes) -> str | None:
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value.get("type") if isinstance(value, dict) else None


async def arrived(store: ArchiveStore, *events: EventMessage, status: str = archive.QUEUED) -> None:
    """The ingress's rows of `events` (type test.event, no headers)."""
    await store.write_arrivals([archive.arrival_row(e, "test.event", "{}", status) for e in events])


async def ran(store: ArchiveStore, *runs: EventMessage) -> None:
    """Each run's completion, as a worker's: a lease, then complete_events (naming its arrival)."""
    completions = CompletionStore(store._database)
    leases = await completions.take_leases(store._database, [run.key for run in runs], 5000)
    assert await completions.complete_events(store._database, [(run, leases[run.key].token) for run in runs]) == len(
        runs
    )


async def statuses(store: ArchiveStore, key: str) -> list[tuple[str, int]]:
    """The key's archived (status, attempts), oldest arrival first."""
    rows = await store._database.fetch(
        "SELECT status, attempts FROM event_archive WHERE key = $1 ORDER BY received_at, arrival", key
    )
    return [tuple(row.values()) for row in rows]
