"""The handler interface (docs/reference.md §7) and how a source's `handler` is found.

    async def handle(event, ctx) -> dict | None

`event` carries source, event_id, key, payload, headers, received_at,
attempt; `ctx` carries db (the asyncpg connection inside the completion
transaction), options (the source's handler_options) and logger. Raising
`PermanentError` dead-letters the event at once; anything else is retried.
"""

import importlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any


class PermanentError(Exception):
    """The event can never succeed: dead-letter it without retrying."""


@dataclass(frozen=True)
class Event:
    source: str
    event_id: str
    key: str
    headers: dict[str, str]
    received_at: datetime
    attempt: int
    body: bytes = field(repr=False)

    @cached_property
    def payload(self) -> Any:
        """The parsed JSON body, parsed on first use (stdlib json: exact big integers)."""
        return json.loads(self.body)


@dataclass(frozen=True)
class HandlerContext:
    db: Any
    options: dict[str, Any]
    logger: Any


Handler = Callable[[Event, HandlerContext], Awaitable[dict | None]]


def load_handler(reference: str) -> Handler:
    """A built-in name (`inbox`, `forward`) or `module:function`."""
    if reference == "inbox":
        from webhook_ingest.workers.handlers.inbox import handle
    elif reference == "forward":
        from webhook_ingest.workers.handlers.forward import handle
    else:
        module_name, _, attribute = reference.partition(":")
        handle = getattr(importlib.import_module(module_name), attribute)
    return handle
