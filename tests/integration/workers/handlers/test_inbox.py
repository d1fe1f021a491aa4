"""The built-in `inbox` against the real Postgres: its batch form
(`handle.batch`, one statement for a batch's events) writes the rows its
handler writes one by one."""

import dataclasses
from datetime import UTC, datetime

import asyncpg

from webhook_ingest.workers.handlers.inbox import handle
from webhook_ingest.workers.handlers.interface import Event, HandlerContext

FORM = {"content-type": "application/x-www-form-urlencoded"}


def event(event_id: str, body: bytes, headers: dict[str, str] | None = None) -> Event:
    return Event(
        source="acme",
        event_id=event_id,
        key=f"acme:{event_id}",
        headers=headers or {"content-type": "application/json"},
        received_at=datetime(2026, 11, 29, 22, 0, 1, 250_000, tzinfo=UTC),
        attempt=1,
        body=body,
    )


async def test_the_batch_form_writes_the_rows_the_handler_writes_one_by_one(database):
    events = [
        event("evt_1", b'{"id": "evt_1", "amount": 12345678901234567890}'),
        event("evt_2", b"id=evt_2&name=caf%C3%A9", FORM),
        event("evt_3", b'{"id": "evt_3", "nested": {"a": [1, 2]}}'),
    ]
    connection = await asyncpg.connect(database)
    try:
        ctx = HandlerContext(db=connection, options={}, logger=None)
        for one in events:
            await handle(one, ctx)
        alone = await _rows(connection)
        await connection.execute("TRUNCATE inbox")
        await handle.batch(events, ctx)
        assert await _rows(connection) == alone and len(alone) == 3
        await handle.batch([dataclasses.replace(events[0], body=b'{"id": "evt_1", "other": 1}')], ctx)
        assert await _rows(connection) == alone  # a key written already keeps its first row
    finally:
        await connection.close()


async def _rows(connection: asyncpg.Connection) -> list[tuple]:
    rows = await connection.fetch("SELECT key, source, event_id, payload::text, received_at FROM inbox ORDER BY key")
    return [tuple(row) for row in rows]
