"""Tracing on: the OpenTelemetry SDK and instrumentations behind
`shared/observability/tracing.py`, imported only once an `OTEL_*` variable asks for
traces (docs/design.md, "Traces").

The SDK reads its own variables: `OTEL_SERVICE_NAME` and
`OTEL_RESOURCE_ATTRIBUTES` (the service name defaults to
`webhook-ingest-<role>`), `OTEL_TRACES_SAMPLER[_ARG]`, `OTEL_BSP_*`, and the
OTLP exporter's endpoint, headers, timeout, compression and certificate.
The instrumentations the OpenTelemetry project ships do the rest where
they fit: aiohttp's server (a span per request), aiohttp's client (the
`forward` handler's call, its `traceparent` sent on downstream), aio-pika's
publishes (a PRODUCER span, its context injected into the message),
asyncpg and redis (a span per statement or command). Not aio-pika's
consumer side: our callback only hands a message to a task, or to a batch
of many events, so the worker parents its spans by hand, from each
message's own headers.
"""

import contextlib
import os
import warnings
from collections.abc import Awaitable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import aio_pika
from aiohttp import web
from aiohttp.typedefs import Middleware
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.instrumentation import aiohttp_server
from opentelemetry.instrumentation.aio_pika import AioPikaInstrumentor
from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor
from opentelemetry.instrumentation.redis import RedisInstrumentor
from opentelemetry.instrumentation.utils import unwrap
from opentelemetry.propagators.textmap import CarrierT, Getter, Setter, TextMapPropagator, default_getter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes, AttributeValue

from webhook_ingest.shared.errors import ConfigError
from webhook_ingest.shared.event import EventMessage

from .loggers import get_logger

log = get_logger(__name__)
T = TypeVar("T")

REPLAY_SPAN = "replay"
# Requests that start no trace: probes and scrapes every few seconds, and
# requests no route matched (scanners).
QUIET_ROUTES = frozenset({"", "/healthz", "/readyz", "/metrics"})
W3C = TraceContextTextMapPropagator()  # what the AMQP headers carry, whatever OTEL_PROPAGATORS says for HTTP


class Tracing:
    """One process's tracing: its provider, its instrumentations, and the spans of ours."""

    def __init__(self, role: str, exporter: SpanExporter | None = None):
        self.provider = TracerProvider(resource=_resource(role))
        self.provider.sampler = EventRoots(self.provider.sampler)  # before any tracer is made: they keep it
        for processor in _processors(exporter):
            self.provider.add_span_processor(processor)
        if exporter is None:  # a process's own: also for handlers that make spans of their own
            trace.set_tracer_provider(self.provider)
        self._tracer = self.provider.get_tracer("webhook_ingest")
        self._propagator = propagate.get_global_textmap()
        propagate.set_global_textmap(NoExtract(self._propagator))
        _instrument(self.provider)
        self.server_middleware = _server_middleware(self.provider) if role == "ingress" else None
        log.info(
            "tracing_on",
            role=role,
            service=self.provider.resource.attributes.get("service.name"),
            sampler=self.provider.sampler.get_description(),
            exporters=os.environ.get("OTEL_TRACES_EXPORTER", "otlp") if exporter is None else "in-process",
        )

    def stop(self) -> None:
        for instrumentor in _INSTRUMENTORS:
            instrumentor().uninstrument()
        propagate.set_global_textmap(self._propagator)
        self.provider.shutdown()

    def span(self, name: str, event: EventMessage | None, failed_by_errors: bool) -> contextlib.AbstractContextManager:
        return self._tracer.start_as_current_span(
            name, context=_parent(event), attributes=_about(event), set_status_on_exception=failed_by_errors
        )

    def describe(self, event: EventMessage) -> None:
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attributes(
                {"webhook.source": event.source, "webhook.key": event.key, "webhook.event_id": event.event_id}
            )

    @contextlib.contextmanager
    def spans(self, name: str, events: list[EventMessage]) -> Iterator[None]:
        started = [self._tracer.start_span(name, context=_parent(event), attributes=_about(event)) for event in events]
        try:
            yield
        except Exception as exc:
            for span in started:
                span.record_exception(exc)
            raise
        finally:
            for span in started:
                span.end()

    @contextlib.contextmanager
    def continued(self, event: EventMessage) -> Iterator[None]:
        token = otel_context.attach(W3C.extract(event.trace_context))
        try:
            yield
        finally:
            otel_context.detach(token)

    async def within(self, event: EventMessage, awaitable: Awaitable[T]) -> T:
        with self.continued(event):
            return await awaitable

    def carried(self, event: EventMessage) -> EventMessage:
        carrier: dict[str, str] = {}
        W3C.inject(carrier)
        return replace(event, trace_context=carrier) if carrier else event

    def replaying(self, dead_letter: Any, replay_id: int) -> contextlib.AbstractContextManager:
        attributes = {
            "webhook.dead_letter_id": int(dead_letter["id"]),
            "webhook.replay_id": replay_id,
            "webhook.source": dead_letter["source"],
            "webhook.key": dead_letter["key"],
        }
        return self._tracer.start_as_current_span(
            REPLAY_SPAN, context=Context(), attributes=attributes, links=_link_to(dead_letter)
        )

    def replaying_selection(self, source: str, key: str, replay_id: int) -> contextlib.AbstractContextManager:
        attributes: dict[str, str | int] = {
            "webhook.events_replay_id": replay_id,
            "webhook.source": source,
            "webhook.key": key,
        }
        return self._tracer.start_as_current_span(REPLAY_SPAN, context=Context(), attributes=attributes)

    def add_trace_ids(self, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        span_context = trace.get_current_span().get_span_context()
        if span_context.is_valid and span_context.trace_flags.sampled:
            event_dict.setdefault("trace_id", format(span_context.trace_id, "032x"))
            event_dict.setdefault("span_id", format(span_context.span_id, "016x"))
        return event_dict


class EventRoots(Sampler):
    """Traces start where events do: at a request to the ingress (not a
    probe, a scrape or an unrouted path) or at a replay. A span without a
    parent anywhere else — a gauge's statement, the relay's claim, a lease
    renewal shared by many runs, a notification's POST — is not recorded;
    the rest is left to the configured sampler (OTEL_TRACES_SAMPLER)."""

    def __init__(self, delegate: Sampler):
        self._delegate = delegate

    def should_sample(
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        has_parent = trace.get_current_span(parent_context).get_span_context().is_valid
        if not has_parent and not _starts_a_trace(name, kind, attributes or {}):
            return SamplingResult(Decision.DROP)
        return self._delegate.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self) -> str:
        return f"EventRoots{{{self._delegate.get_description()}}}"


class NoExtract(TextMapPropagator):
    """Injects as the configured propagator does and extracts nothing: a
    webhook's sender is outside our trust, and its `traceparent` would pick
    our trace ids and, through the sampled flag, which events we trace
    (docs/design.md, "Traces")."""

    def __init__(self, inner: TextMapPropagator):
        self._inner = inner

    def extract(
        self, carrier: CarrierT, context: Context | None = None, getter: Getter[CarrierT] = default_getter
    ) -> Context:
        return context if context is not None else Context()

    def inject(self, carrier: CarrierT, context: Context | None = None, setter: Setter[CarrierT] | None = None) -> None:
        if setter is None:
            self._inner.inject(carrier, context)
        else:
            self._inner.inject(carrier, context, setter)

    @property
    def fields(self) -> set[str]:
        return self._inner.fields


def _starts_a_trace(name: str, kind: SpanKind | None, attributes: Mapping[str, AttributeValue]) -> bool:
    if kind is SpanKind.SERVER:
        return attributes.get("http.route", "") not in QUIET_ROUTES
    return name == REPLAY_SPAN


def _about(event: EventMessage | None) -> dict[str, Any] | None:
    """What a span of the event is found by: its source and key (and which attempt it is)."""
    if event is None:
        return None
    return {"webhook.source": event.source, "webhook.key": event.key, "webhook.attempt": event.attempt}


def _parent(event: EventMessage | None) -> Context | None:
    """The context of the span that published `event`'s message; None (the current one) without it."""
    return W3C.extract(event.trace_context) if event is not None and event.trace_context else None


def _link_to(dead_letter: Any) -> list[Link]:
    """A link to the trace of the dead letter's last attempt, when it ran in one."""
    trace_id, span_id = dead_letter.get("last_trace_id"), dead_letter.get("last_span_id")
    try:
        linked = SpanContext(
            int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED)
        )
    except (TypeError, ValueError):  # none recorded (an attempt not traced), or not hex
        return []
    return [Link(linked)] if linked.is_valid else []


def _resource(role: str) -> Resource:
    """OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES as the SDK reads them; the service named after the role else."""
    detected = Resource.create()
    if str(detected.attributes.get("service.name", "")).startswith("unknown_service"):
        return detected.merge(Resource({"service.name": f"webhook-ingest-{role}"}))
    return detected


def _processors(exporter: SpanExporter | None) -> list[SpanProcessor]:
    """Given an exporter (tests): each span exported as it ends. Else a batch processor per exporter named."""
    if exporter is not None:
        return [SimpleSpanProcessor(exporter)]
    names = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() or "otlp"
    return [BatchSpanProcessor(_exporter(name.strip())) for name in names.split(",") if name.strip() != "none"]


def _exporter(name: str) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    if name != "otlp":
        raise ConfigError(f"OTEL_TRACES_EXPORTER: {name!r} is not an exporter we have (otlp, console or none)")
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if (protocol or "http/protobuf") != "http/protobuf":
        raise ConfigError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not served; only http/protobuf (a collector's port 4318)"
        )
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # endpoint, headers, timeout, compression, certificate: its own OTEL_EXPORTER_OTLP_*


_INSTRUMENTORS = (
    aiohttp_server.AioHttpServerInstrumentor,
    AioHttpClientInstrumentor,
    AioPikaInstrumentor,
    AsyncPGInstrumentor,
    RedisInstrumentor,
)


def _instrument(provider: TracerProvider) -> None:
    """The shipped instrumentations of the libraries we call, on."""
    for instrumentor in _INSTRUMENTORS[1:]:
        instrumentor().instrument(tracer_provider=provider)
    unwrap(aio_pika.Queue, "consume")  # the consumer side does not fit: see the module's docstring


def _server_middleware(provider: TracerProvider) -> Middleware:
    """aiohttp-server's middleware, for the ingress's app alone. Its
    instrumentor sets up the middleware's tracer, meters and excluded URLs,
    and would also replace `web.Application` for every app made after it:
    the admin API's and the console's sub-apps (a second SERVER span per
    request) and the worker's metrics server. So that class is put back,
    and `create_app` adds the middleware itself."""
    application = web.Application
    with warnings.catch_warnings():  # aiohttp discourages that subclass; it is put back below
        warnings.simplefilter("ignore", DeprecationWarning)
        aiohttp_server.AioHttpServerInstrumentor().instrument(tracer_provider=provider)
    web.Application = application  # type: ignore[misc]
    return aiohttp_server.create_aiohttp_middleware(provider)
