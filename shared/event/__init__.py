"""webhook_ingest.shared.event: what each of its modules holds.

- ids         Event ids, content hashes and idempotency keys (docs/reference.md §5).
- types       An event's type, when its provider names one
- message     The event message on the broker: defined once, used by both sides.
- amqp_table  A message's AMQP properties encoded as pamqp encodes them, byte for byte, at a fraction of its …
- ordered     Where an event stands in its ordering key's lane: the holder's view of the row it runs.
- payloads    What a handler's `event.payload` is, in one place.
"""

from typing import TYPE_CHECKING, Any

from .ordered import OrderedStep
from .payloads import Form

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_EVENT_ID_BYTES",
    "EventMessage",
    "Form",
    "OrderedStep",
    "amqp_headers",
    "amqp_properties",
    "default_selectors",
    "from_amqp",
    "headers_fit",
    "ids",
    "new_arrival",
    "payloads",
    "provider_headers",
    "to_amqp",
    "types",
    "utf8_text",
]

if TYPE_CHECKING:
    from .message import (
        MAX_BODY_BYTES,
        MAX_EVENT_ID_BYTES,
        EventMessage,
        amqp_headers,
        amqp_properties,
        from_amqp,
        headers_fit,
        new_arrival,
        provider_headers,
        to_amqp,
        utf8_text,
    )
    from .types import default_selectors


def __getattr__(name: str) -> Any:
    """The broker message and the event types read with it (and aio_pika under them) load on
    first use: the handler API imports `payloads` from here, and stays light."""
    if name in {
        "EventMessage",
        "MAX_BODY_BYTES",
        "MAX_EVENT_ID_BYTES",
        "amqp_headers",
        "amqp_properties",
        "from_amqp",
        "headers_fit",
        "new_arrival",
        "provider_headers",
        "to_amqp",
        "utf8_text",
    }:
        from . import message

        return getattr(message, name)
    if name == "default_selectors":
        from . import types

        return getattr(types, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
