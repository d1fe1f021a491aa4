"""An event's type, when its provider names one: what the archive keeps and
on-call searches by (`invoice.paid`, `push`, `orders/create`).

A source's `event_type` is a list of selectors, written and resolved exactly
as its `event_id` (docs/reference.md §5): `header:NAME`, `body:dotted.path`
or a template, the first that resolves to a non-empty value winning. It is
resolved at the ingress from the payload the request's verification
already parsed, so no body is parsed twice. Unset, the scheme's default
below; a scheme without one has no type unless the source names where it is.
"""

from collections.abc import Mapping, Sequence

from . import ids as event_id
from .message import utf8_text

MAX_EVENT_TYPE_CHARS = 200  # a type is a short name; a longer value is cut, never refused

# What a sender that is not one provider in particular tends to use: the signed body's first,
# X-Event-Type (signed by nothing) only when the body names none.
_GENERIC = ("body:type", "body:event_type", "header:X-Event-Type")

DEFAULT_EVENT_TYPE: dict[str, tuple[str, ...]] = {
    "stripe": ("body:type",),
    "github": ("header:X-GitHub-Event",),
    "shopify": ("header:X-Shopify-Topic",),
    "paystack": ("body:event",),
    "standard-webhooks": ("body:type",),
    "standard-webhooks-v1a": ("body:type",),
    "hmac-sha256": _GENERIC,
    "basic-auth": _GENERIC,
    "api-key": _GENERIC,
    "gitlab": ("header:X-Gitlab-Event",),
    "slack": ("body:event.type", "body:type"),  # an event_callback's inner event, else the payload's own
    "square": ("body:type",),
}


def default_selectors(scheme: str) -> tuple[str, ...]:
    return DEFAULT_EVENT_TYPE.get(scheme, ())


def resolve(selectors: Sequence[event_id.Selector], headers: Mapping[str, str], payload: object) -> str | None:
    """The event's type, or None when no selector resolves."""
    value = event_id.resolve_event_id(selectors, headers, payload)
    return None if value is None else utf8_text(value)[:MAX_EVENT_TYPE_CHARS]
