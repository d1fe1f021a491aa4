"""shared/observability/tracing.py without services: which variables turn tracing on,
what an event's message carries of its trace, and what tracing off costs
(nothing made: the same do-nothing every time)."""

import asyncio
import logging
import sys

import pytest
import structlog
from hypothesis import given
from hypothesis import strategies as st

from tests.support.events import make_event
from webhook_ingest.ingress.publishing.outbox import decode_message, encode_message
from webhook_ingest.shared import observability
from webhook_ingest.shared.errors import ConfigError
from webhook_ingest.shared.event.message import from_amqp, to_amqp
from webhook_ingest.shared.observability import tracing
from webhook_ingest.shared.observability.logging import configure_logging

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
TRACED = {"traceparent": TRACEPARENT, "tracestate": "vendor=opaque"}


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "hooks"}, False),  # naming the service alone turns nothing on
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": " "}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, False),
        ({"OTEL_SDK_DISABLED": "false", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
    ],
)
def test_which_variables_turn_tracing_on(environ, on):
    assert tracing.wanted(environ) is on


def test_a_traced_events_context_travels_in_its_amqp_headers_and_through_the_outbox():
    event = make_event("acme", "evt_1")
    traced = type(event)(**{**event.__dict__, "trace_context": TRACED})
    message = to_amqp(traced)
    assert {name: message.headers[name] for name in TRACED} == TRACED
    assert from_amqp(message.body, message.headers).trace_context == TRACED
    assert decode_message(*encode_message(traced)).trace_context == TRACED  # an outbox row
    assert traced.next_attempt({"attempt": 1}).trace_context == TRACED  # a retry
    assert traced.fresh(replay_of=7).trace_context == {}  # a replay starts a trace of its own


def test_an_untraced_event_carries_no_trace_header():
    message = to_amqp(make_event("acme", "evt_1"))
    assert not {"traceparent", "tracestate"} & set(message.headers)
    assert from_amqp(message.body, message.headers).trace_context == {}


def test_a_failed_attempts_record_names_its_trace():
    event = make_event("acme", "evt_1")
    traced = type(event)(**{**event.__dict__, "trace_context": TRACED})
    assert tracing.trace_ids(traced) == {"trace_id": "0af7651916cd43dd8448eb211c80319c", "span_id": "b7ad6b7169203331"}
    assert tracing.trace_ids(event) == {}


@given(st.text())
def test_any_traceparent_gives_its_ids_or_none_never_an_error(traceparent):
    event = make_event("acme", "evt_1")
    ids = tracing.trace_ids(type(event)(**{**event.__dict__, "trace_context": {"traceparent": traceparent}}))
    assert ids == {} or (len(ids["trace_id"]), len(ids["span_id"])) == (32, 16)


def test_off_every_call_is_the_same_do_nothing():
    assert not tracing.wanted({}) and tracing._on is None
    event = make_event("acme", "evt_1")
    traced = type(event)(**{**event.__dict__, "trace_context": TRACED})
    made = {
        id(tracing.span("claim", traced)),
        id(tracing.span("handler", traced, failed_by_errors=True)),
        id(tracing.spans("commit", [traced])),
        id(tracing.continued(traced)),
        id(tracing.replaying({}, 1)),
    }
    assert len(made) == 1  # one shared nullcontext: no span object, no context
    coroutine = asyncio.sleep(0)
    assert tracing.within(traced, coroutine) is coroutine
    coroutine.close()
    assert tracing.carried(event) is event
    assert tracing.server_middlewares() == []
    line = {"event": "x"}
    assert tracing.add_trace_ids(None, "info", line) == {"event": "x"}


def test_every_log_line_goes_through_the_trace_ids_step():
    before, root = structlog.get_config(), logging.getLogger()
    handlers, level = root.handlers[:], root.level
    configure_logging("json")
    try:
        assert tracing.add_trace_ids in structlog.get_config()["processors"]
    finally:
        structlog.configure(**before)
        root.handlers[:], root.level = handlers, level


@pytest.mark.parametrize(
    ("name", "value", "complaint"),
    [
        ("OTEL_TRACES_EXPORTER", "zipkin", "OTEL_TRACES_EXPORTER: 'zipkin'"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc", "OTEL_EXPORTER_OTLP_PROTOCOL: 'grpc'"),
    ],
)
def test_an_exporter_we_cannot_serve_is_refused_in_one_line(monkeypatch, name, value, complaint):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=complaint):
        tracing.start("worker")
    assert tracing._on is None


def test_tracing_asked_for_without_opentelemetry_installed_is_one_line(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    for name in ["opentelemetry", *(name for name in sys.modules if name.startswith("opentelemetry."))]:
        monkeypatch.setitem(sys.modules, name, None)  # what an install without the extra finds
    monkeypatch.delitem(sys.modules, "webhook_ingest.shared.observability.tracing_otel", raising=False)
    monkeypatch.delattr(observability, "tracing_otel", raising=False)
    with pytest.raises(ConfigError, match=r"pip install 'webhook-ingest\[otel\]'"):
        tracing.start("ingress")
    assert tracing._on is None
