"""OpenTelemetry traces, opt-in through the standard `OTEL_*` variables
(docs/operations.md, "Tracing"; why so: docs/design.md, "Traces").

On when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
is set, or `OTEL_TRACES_EXPORTER` names an exporter (`otlp`, `console`);
`OTEL_TRACES_EXPORTER=none` or `OTEL_SDK_DISABLED=true` keeps it off. Off,
this module is all that runs: it imports nothing of OpenTelemetry, and each
call returns at once a shared do-nothing (or what it was given), so no span
object is ever made. On, `start()` loads `tracing_otel.py`, where every
OpenTelemetry call lives.

What travels with an event is the W3C `traceparent` (and `tracestate`) of
the span that published its message, as AMQP headers of those names
(`EventMessage.trace_context`): every step of the event — retries,
deferrals, the outbox — continues that trace, and the worker's spans are
its children.
"""

import contextlib
import os
from collections.abc import Coroutine, Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from webhook_ingest.shared.event import EventMessage

T = TypeVar("T")
OTLP_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_NOTHING = contextlib.nullcontext()
_on: Any = None  # tracing_otel.Tracing while tracing is on


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment turns tracing on."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return exporters != "none"
    return any(environ.get(name, "").strip() for name in OTLP_ENDPOINTS)


def start(role: str, exporter: Any = None) -> bool:
    """Tracing for this process (`role`: ingress, worker, cli) when the
    environment asks for it, or into `exporter` (tests); whether it is on.
    Raises ConfigError for an exporter or protocol we cannot serve."""
    global _on
    if _on is None and (exporter is not None or wanted()):
        try:
            from . import tracing_otel

            _on = tracing_otel.Tracing(role, exporter)
        except ImportError as exc:  # installed without the `otel` extra
            from webhook_ingest.shared.errors import ConfigError

            raise ConfigError(
                f"tracing is asked for (OTEL_*) but OpenTelemetry is not installed ({exc.name}):"
                " pip install 'webhook-ingest[otel]'"
            ) from exc
    return _on is not None


def stop() -> None:
    """Sends what is left and takes the instrumentations out: off again."""
    global _on
    if _on is not None:
        _on.stop()
        _on = None


def is_on() -> bool:
    """Whether tracing is on. A publish that leaves aio-pika's exchange out
    (the ingress's, ingress/publishing/publisher.py) goes through it while tracing is
    on: aio-pika's instrumentation makes the PRODUCER span and puts its
    `traceparent` in the message there."""
    return _on is not None


def server_middlewares() -> list:
    """The aiohttp middleware that makes a request's span (first in the ingress app)."""
    return [] if _on is None else [_on.server_middleware]


def span(
    name: str, event: "EventMessage | None" = None, failed_by_errors: bool = False
) -> contextlib.AbstractContextManager:
    """A span, current while the block runs: the child of `event`'s
    message, and described by it (the current span's child when no event
    is given). An exception leaving the block is recorded on it, and marks
    it failed only with `failed_by_errors` (a handler's failure, not a
    duplicate's way out of a claim)."""
    return _NOTHING if _on is None else _on.span(name, event, failed_by_errors)


def describe(event: "EventMessage") -> None:
    """The current span (the ingress's request) said to be `event`'s: its source, key and event id."""
    if _on is not None:
        _on.describe(event)


def spans(name: str, events: Iterable["EventMessage"]) -> contextlib.AbstractContextManager:
    """One span per event, each the child of its own message, over one block
    (a batch's step): none is current."""
    return _NOTHING if _on is None else _on.spans(name, list(events))


def continued(event: "EventMessage") -> contextlib.AbstractContextManager:
    """`event`'s trace as the current one while the block runs: its log
    lines, and the spans made in it (a publish's), belong to the event."""
    return _NOTHING if _on is None or not event.trace_context else _on.continued(event)


def within(event: "EventMessage", coroutine: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
    """`coroutine` run under `continued(event)` (given back as it is when off)."""
    return coroutine if _on is None or not event.trace_context else _on.within(event, coroutine)


def carried(event: "EventMessage") -> "EventMessage":
    """`event` carrying the current span as its message's parent (the outbox
    stores it so); the same event when off."""
    return event if _on is None else _on.carried(event)


def replaying(dead_letter: Mapping[str, Any], replay_id: int) -> contextlib.AbstractContextManager:
    """The span a replay publishes under: a new trace, linked to the one its
    dead letter's last attempt ran in (`last_trace_id`, `last_span_id`)."""
    return _NOTHING if _on is None else _on.replaying(dead_letter, replay_id)


def replaying_selection(source: str, key: str, replay_id: int) -> contextlib.AbstractContextManager:
    """The span a replay by selection publishes one event under (`events
    replay`): a new trace, as a dead letter's replay starts one; the archive
    keeps no trace of the event's own run to link to."""
    return _NOTHING if _on is None else _on.replaying_selection(source, key, replay_id)


def trace_ids(event: "EventMessage") -> dict[str, str]:
    """`trace_id` and `span_id` of the span that published `event`'s message,
    for its failed attempt's record (and so its dead letter); none when it
    carries no trace. Read from the header itself: no OpenTelemetry needed."""
    parts = event.trace_context.get("traceparent", "").split("-")
    if len(parts) < 4 or len(parts[1]) != 32 or len(parts[2]) != 16:
        return {}
    return {"trace_id": parts[1], "span_id": parts[2]}


def add_trace_ids(logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """structlog processor: the current span's `trace_id` and `span_id` on
    every log line made inside a trace."""
    return event_dict if _on is None else _on.add_trace_ids(event_dict)
