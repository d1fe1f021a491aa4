"""`inbox`: store the event in table `inbox`, through the completion transaction."""

from webhook_ingest.shared.queries import load_queries
from webhook_ingest.workers.handlers import Event, HandlerContext

_INSERT = load_queries("webhook_ingest.workers")["insert_inbox"]


async def handle(event: Event, ctx: HandlerContext) -> None:
    # The raw body goes to jsonb as text: Postgres parses it, we never re-serialise.
    await ctx.db.execute(_INSERT, event.key, event.source, event.event_id, event.body.decode(), event.received_at)


# Its only effect goes through ctx.db: the worker may run many events'
# inbox inserts in one transaction (`workers.batch`).
handle.batchable = True  # type: ignore[attr-defined]  # a function attribute, read with getattr
