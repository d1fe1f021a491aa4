"""`inbox`: store the event in table `inbox`, through the completion transaction."""

import json

from webhook_ingest.shared.db import load_queries
from webhook_ingest.shared.event import payloads

from .interface import Event, HandlerContext

_QUERIES = load_queries("webhook_ingest.workers")
_INSERT, _INSERT_MANY = _QUERIES["insert_inbox"], _QUERIES["insert_inbox_many"]


async def handle(event: Event, ctx: HandlerContext) -> None:
    await ctx.db.execute(_INSERT, event.key, event.source, event.event_id, _payload_json(event), event.received_at)


async def handle_many(events: list[Event], ctx: HandlerContext) -> None:
    """`handle` for a batch's events, in one statement (`handle.batch`)."""
    await ctx.db.execute(
        _INSERT_MANY,
        [event.key for event in events],
        [event.source for event in events],
        [event.event_id for event in events],
        [_payload_json(event) for event in events],
        [event.received_at for event in events],
    )


def _payload_json(event: Event) -> str:
    """A JSON body goes to jsonb as text: Postgres parses it, we never re-serialise.
    A url-encoded form is stored as its decoded fields (docs/reference.md §7)."""
    if payloads.is_form(event.headers.get("content-type")):
        return json.dumps(event.payload, ensure_ascii=False)
    return event.body.decode()


# Its only effect goes through ctx.db: the worker may run many events'
# inbox inserts in one transaction (`workers.claim.batch`).
handle.batchable = True  # type: ignore[attr-defined]  # a function attribute, read with getattr
handle.batch = handle_many  # type: ignore[attr-defined]  # those events' rows in one statement
