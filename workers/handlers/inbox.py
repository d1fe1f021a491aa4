"""`inbox`: store the event in table `inbox`, through the completion transaction."""

import json

from webhook_ingest.shared.db import load_queries
from webhook_ingest.shared.event import payloads

from .interface import Event, HandlerContext

_INSERT = load_queries("webhook_ingest.workers")["insert_inbox"]


async def handle(event: Event, ctx: HandlerContext) -> None:
    await ctx.db.execute(_INSERT, event.key, event.source, event.event_id, _payload_json(event), event.received_at)


def _payload_json(event: Event) -> str:
    """A JSON body goes to jsonb as text: Postgres parses it, we never re-serialise.
    A url-encoded form is stored as its decoded fields (docs/reference.md §7)."""
    if payloads.is_form(event.headers.get("content-type")):
        return json.dumps(event.payload, ensure_ascii=False)
    return event.body.decode()


# Its only effect goes through ctx.db: the worker may run many events'
# inbox inserts in one transaction (`workers.claim.batch`).
handle.batchable = True  # type: ignore[attr-defined]  # a function attribute, read with getattr
