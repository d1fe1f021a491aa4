"""The event message on the broker: defined once, used by both sides.

The AMQP body is the request body exactly as the provider sent it (a JSON
round trip could change numbers and break hashes); what the pipeline knows
about the event travels in AMQP headers.

Two encodings are chosen for the wire, not for Python:
- the receive time travels as integer milliseconds (`x-received-at-ms`):
  pamqp writes a Python float in a header table as a 32-bit float, tens of
  seconds off for a unix time. `x-received-at` (that float) is still written
  for workers of the previous release and read from messages it queued.
- every publish carries its own AMQP `message_id`: the client matches a
  broker's return (unroutable) to its publish by that id, so two copies of
  one key published at once must not share it.
- every accepted request is an arrival with its own id (`x-arrival`), drawn
  by the ingress and kept by every message that carries the event on (a
  retry, a route's fan-out, the outbox, a dead letter's replay): the event
  archive's row of that arrival (shared/archive/model.py), whatever its receive
  time shares with another copy's.
- a traced event's W3C `traceparent` and `tracestate` travel as headers of
  those names, the names OpenTelemetry's instrumentations use
  (shared/observability/tracing.py).
"""

import os
from dataclasses import dataclass, field, replace
from typing import cast

import aio_pika
import orjson
from multidict import MultiMapping
from pamqp.commands import Basic
from pamqp.common import FieldTable

from . import amqp_table
from .ordered import OrderedStep

# What one AMQP content header frame must hold (RabbitMQ's frame_max is
# 128 KiB, and a message whose headers do not fit makes the broker close the
# whole connection): the provider's headers and the event id are bounded at
# the door, leaving room for the retries' error history.
MAX_PROVIDER_HEADERS_BYTES = 64 * 1024
MAX_EVENT_ID_BYTES = 1024  # also keeps the key within a Postgres btree entry (2704 bytes)
MAX_ERRORS_BYTES = 32 * 1024  # the error history a retry message carries
# A header table's field names: pamqp cuts a longer one to this, only
# logging it, so two names sharing their first 128 bytes would become one.
MAX_HEADER_NAME_BYTES = 128
# What one broker message carries: RabbitMQ refuses a larger body
# (max_message_size, 128 MiB by default up to 3.13; 4.x lowered the default
# to 16 MiB) by closing the publishing channel. A source's body limit stays
# below it, one header frame's room to spare: an event accepted into the
# outbox that no publish could carry would wait there for ever.
MAX_BROKER_MESSAGE_BYTES = 128 * 1024 * 1024
MAX_BODY_BYTES = MAX_BROKER_MESSAGE_BYTES - 128 * 1024
CONTENT_TYPE = "application/json"
PERSISTENT = 2  # AMQP delivery mode: written to disk (aio_pika.DeliveryMode.PERSISTENT)

# Request headers that are transport details or credentials, never handed on.
_DROPPED_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "accept-encoding",
        "te",
        "upgrade",
    }
)


@dataclass(frozen=True)
class EventMessage:
    key: str
    source: str
    event_id: str
    payload_sha256: str
    received_at: float  # unix seconds, when the ingress received the request
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)  # provider's request headers, lower-case names
    attempt: int = 1
    errors: tuple[dict, ...] = ()  # one {"attempt", "at", "type", "message", "traceback"} per failed attempt
    # Deliveries of this event that were never acknowledged (their worker
    # died), counted across the messages that carried it: a deferral or a
    # retry is a new message, whose quorum-queue delivery count starts at 0.
    deliveries: int = 0
    # The AMQP message id of the delivery that carried it (each publish has
    # its own): a completion records it, so a redelivery can tell that its own
    # earlier delivery completed the event. Not part of the event itself.
    message_id: str = ""
    # When a worker first found no source of this name (unix ms; 0: never):
    # how long it has waited for a worker that knows it (a rolling deploy).
    unknown_source_since_ms: int = 0
    # The replay (dead_letter_replays.id) that started this retry chain (0:
    # the ingress's event): a newer chain's attempt 1 is not a copy of an
    # older chain's attempt already run (workers/claim/attempts.py).
    replay_of: int = 0
    # The W3C trace context of the span that published it (`traceparent`,
    # `tracestate`), empty when untraced: its steps continue that trace.
    trace_context: dict[str, str] = field(default_factory=dict)
    # The route (shared/sources/routes.py) this message runs, its key then `KEY#ROUTE`;
    # "" for the event itself: its source's one handler, or its routes' fan-out.
    route: str = ""
    # The accepted request this message carries (new_arrival(); 0: queued
    # before arrivals had ids): its row of the event archive.
    arrival: int = 0
    # Its row of an ordering key's lane (shared/event/ordered.py), when the
    # worker holding the lane runs it; never on the wire: None from the broker.
    ordered: OrderedStep | None = None
    # A routed event's routes that the ingress wrote to their ordering
    # lanes instead (shared/ordering/): its fan-out skips them, each runs
    # only in its lane. Empty from an ingress of an earlier release: all fanned out.
    laned_routes: tuple[str, ...] = ()

    def next_attempt(self, error: dict) -> "EventMessage":
        return replace(self, attempt=self.attempt + 1, errors=(*self.errors, error))

    def fresh(self, replay_of: int = 0) -> "EventMessage":
        """The same event with a new attempt budget (replay `replay_of` of its
        dead letter), and no trace yet: a replay starts its own (shared/observability/tracing.py)."""
        return replace(
            self, attempt=1, errors=(), deliveries=0, unknown_source_since_ms=0, replay_of=replay_of, trace_context={}
        )


def provider_headers(request_headers: MultiMapping[str], also_dropped: frozenset[str] = frozenset()) -> dict[str, str]:
    """The headers handed on, lower-case names; a name on several lines is
    one value, the lines joined by ", " (RFC 9110, section 5.3), not its last line.
    `also_dropped` (lower-case names): a source's own credential header."""
    headers: dict[str, str] = {}
    for name, value in request_headers.items():
        name = name.lower()
        if name not in _DROPPED_HEADERS and name not in also_dropped:
            headers[name] = f"{headers[name]}, {utf8_text(value)}" if name in headers else utf8_text(value)
    return headers


def headers_fit(headers: dict[str, str]) -> bool:
    """Whether the provider's headers travel as they are: within their share
    of the frame, and every name whole in the header table."""
    return headers_size(headers) <= MAX_PROVIDER_HEADERS_BYTES and all(
        len(name.encode()) <= MAX_HEADER_NAME_BYTES for name in headers
    )


def headers_size(headers: dict[str, str]) -> int:
    """Bytes the headers take in the AMQP header table, give or take a few per entry."""
    return sum(len(name) + len(value.encode()) + 6 for name, value in headers.items())


def utf8_text(header_value: str) -> str:
    """A header value that UTF-8 (AMQP, Postgres) can carry.

    HTTP allows bytes 0x80-0xff in a header value (obs-text); aiohttp decodes
    the value as UTF-8 with surrogateescape, so a byte that is not UTF-8
    becomes a lone surrogate, which no encoder downstream takes. Such a byte
    becomes the four characters `\\xNN` instead: readable, and the same bytes
    always give the same text (an event id from such a header stays one key).
    """
    if header_value.isascii():
        return header_value
    try:
        header_value.encode()
    except UnicodeEncodeError:
        return header_value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return header_value


def new_arrival() -> int:
    """A random positive 63-bit id (a Postgres bigint, an AMQP signed long):
    two arrivals of one key in one millisecond share it one time in 2**63."""
    return int.from_bytes(os.urandom(8)) >> 1 or 1


def new_message_id() -> str:
    """32 random hex digits: the 16 bytes uuid4() reads too, without building a UUID (4 µs a publish)."""
    return os.urandom(16).hex()


def to_amqp(event: EventMessage) -> aio_pika.Message:
    """The event as aio-pika's message (the outbox's row, the workers' publishes)."""
    return aio_pika.Message(
        body=event.body,
        content_type=CONTENT_TYPE,
        delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
        message_id=new_message_id(),
        headers=amqp_headers(event),
    )


def amqp_properties(event: EventMessage) -> Basic.Properties:
    """What `to_amqp`'s message carries, as the pamqp properties aiormq
    publishes: the ingress's publish skips aio-pika's `Message` (about
    twenty checked attribute writes, then these properties built from them),
    and they marshal in shared/event/amqp_table.py (the same bytes as pamqp's)."""
    return amqp_table.Properties(
        content_type=CONTENT_TYPE, delivery_mode=PERSISTENT, message_id=new_message_id(), headers=amqp_headers(event)
    )


def amqp_headers(event: EventMessage) -> FieldTable:
    return {
        "x-key": event.key,
        "x-source": event.source,
        "x-event-id": event.event_id,
        "x-payload-sha256": event.payload_sha256,
        "x-received-at-ms": round(event.received_at * 1000),
        "x-received-at": event.received_at,  # the previous release's workers read only this
        "x-attempt": event.attempt,
        "x-provider-headers": cast(FieldTable, event.headers),  # str values: a table as it is
        "x-errors": errors_header(event.errors),
        "x-deliveries": event.deliveries,
        **({"x-unknown-source-since-ms": event.unknown_source_since_ms} if event.unknown_source_since_ms else {}),
        **({"x-replay-of": event.replay_of} if event.replay_of else {}),
        **({"x-route": event.route} if event.route else {}),
        **({"x-arrival": event.arrival} if event.arrival else {}),
        **({LANED_ROUTES_HEADER: ROUTES_SEPARATOR.join(event.laned_routes)} if event.laned_routes else {}),
        **event.trace_context,
    }


def from_amqp(body: bytes, headers: dict) -> EventMessage:
    """Rebuild the event; raises KeyError/ValueError for a message we did not write."""
    return EventMessage(
        key=_text(headers["x-key"]),
        source=_text(headers["x-source"]),
        event_id=_text(headers["x-event-id"]),
        payload_sha256=_text(headers["x-payload-sha256"]),
        received_at=_received_at(headers),
        body=body,
        headers={_text(k): _text(v) for k, v in (headers.get("x-provider-headers") or {}).items()},
        attempt=int(headers.get("x-attempt", 1)),
        errors=tuple(orjson.loads(headers.get("x-errors") or "[]")),
        # x-delivery-count: set by the quorum queue on a redelivery
        deliveries=int(headers.get("x-deliveries") or 0) + int(headers.get("x-delivery-count") or 0),
        unknown_source_since_ms=int(headers.get("x-unknown-source-since-ms") or 0),
        replay_of=int(headers.get("x-replay-of") or 0),
        trace_context=_trace_context(headers),
        route=_text(headers.get("x-route") or ""),
        arrival=int(headers.get("x-arrival") or 0),
        laned_routes=_routes(headers.get(LANED_ROUTES_HEADER)),
    )


LANED_ROUTES_HEADER = "x-laned-routes"
ROUTES_SEPARATOR = ","  # never in a route's name (shared/sources/routes.py)


def _routes(value: object) -> tuple[str, ...]:
    return tuple(_text(value).split(ROUTES_SEPARATOR)) if value else ()


_TRACE_HEADERS = ("traceparent", "tracestate")


def _trace_context(headers: dict) -> dict[str, str]:
    if "traceparent" not in headers:
        return {}  # untraced: the common case, no loop
    return {name: _text(headers[name]) for name in _TRACE_HEADERS if name in headers}


def errors_header(errors: tuple[dict, ...]) -> str:
    """The failed attempts as JSON, within MAX_ERRORS_BYTES: with many
    attempts (a large `max_attempts`, long messages) the history would
    outgrow the frame, and the broker would close the worker's connection at
    every retry publish. Over the budget the last error keeps the end of its
    traceback, every earlier one loses its traceback and has its message
    clipped, and past a few hundred attempts the oldest (but the first) are
    left out. Each kept error keeps its attempt, time and type."""
    text = orjson.dumps(errors)
    if len(text) <= MAX_ERRORS_BYTES:
        return text.decode()
    *earlier, last = errors
    last = {**_slim_error(last, MAX_ERRORS_BYTES // 4), "traceback": str(last.get("traceback", ""))[-2048:]}
    share = (MAX_ERRORS_BYTES - len(orjson.dumps(last))) // max(len(earlier), 1)
    slim = [_slim_error(error, share) for error in earlier]
    sizes = [len(orjson.dumps(error)) + 1 for error in slim]
    room, total, keep_from = MAX_ERRORS_BYTES - len(orjson.dumps(last)) - 2, sum(sizes), 1
    while total > room and keep_from < len(slim):
        total -= sizes[keep_from]  # the oldest go first, but the first failure is the one worth keeping
        keep_from += 1
    return orjson.dumps([*slim[:1], *slim[keep_from:], last]).decode()


def _slim_error(error: dict, budget: int) -> dict:
    """`error` without its traceback, its message clipped to fit about `budget` bytes."""
    slim = {name: value for name, value in error.items() if name != "traceback"}
    room = max(budget - len(orjson.dumps({**slim, "message": ""})), 40) // 4  # up to 4 bytes a character
    slim["message"] = str(slim.get("message", ""))[:room]
    return slim


def _received_at(headers: dict) -> float:
    """Unix seconds: exact from the milliseconds, else (a message queued by
    the previous release) the float header, as close as it got."""
    milliseconds = headers.get("x-received-at-ms")
    return int(milliseconds) / 1000 if milliseconds is not None else float(headers["x-received-at"])


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
