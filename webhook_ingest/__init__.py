"""webhook-ingest: verified, durably queued webhooks, processed exactly once.

The handler API is imported from here::

    from webhook_ingest import Context, Event, PermanentError

    async def handle(event: Event, ctx: Context) -> None: ...

`webhook_ingest.cli.main` is the composition root that wires the subpackages
`ingress`, `workers` and `shared` together.
"""

from webhook_ingest.workers.handlers import Event, HandlerContext, PermanentError

Context = HandlerContext

__all__ = ["Context", "Event", "PermanentError"]
