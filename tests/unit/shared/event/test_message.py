"""The event message through pamqp's real wire encoding, as the broker sees it."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import aio_pika
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import frame, header

from webhook_ingest.shared.event.message import EventMessage, amqp_properties, from_amqp, to_amqp, utf8_text

# 2001-09-09 .. 2100-01-01 in milliseconds since the epoch (unix seconds as a
# float keep microseconds exact until about 2242)
received_ms = st.integers(min_value=1_000_000_000_000, max_value=4_102_444_800_000)


def event(received_at: float) -> EventMessage:
    return EventMessage(
        key="s:e1",
        source="s",
        event_id="e1",
        payload_sha256="0" * 64,
        received_at=received_at,
        body=b'{"id":"e1"}',
        headers={"x-a": "1"},
    )


def over_the_wire(message: aio_pika.Message) -> dict:
    """The header table after pamqp encoded the content header frame and decoded it again."""
    encoded = frame.marshal(header.ContentHeader(0, len(message.body), message.properties), 1)
    _, _, decoded = frame.unmarshal(encoded)
    return decoded.properties.headers


@given(received_ms)
def test_received_at_arrives_exact_to_the_millisecond(milliseconds):
    sent = event(milliseconds / 1000)
    received = from_amqp(sent.body, over_the_wire(to_amqp(sent)))
    assert round(received.received_at * 1000) == milliseconds
    assert datetime.fromtimestamp(received.received_at, UTC) == (
        datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=milliseconds)
    )


def test_a_message_queued_by_the_previous_release_is_still_read():
    headers = over_the_wire(to_amqp(event(1_763_900_000.5)))
    del headers["x-received-at-ms"]
    assert abs(from_amqp(b"{}", headers).received_at - 1_763_900_000.5) < 120  # a 32-bit float


def test_every_publish_of_one_key_has_its_own_message_id():
    first, second = to_amqp(event(1.0)), to_amqp(event(1.0))
    assert first.message_id and second.message_id and first.message_id != second.message_id


@given(st.binary(max_size=40))
def test_any_header_bytes_become_utf8_text_the_same_way_every_time(raw):
    as_aiohttp_decodes = raw.decode("utf-8", "surrogateescape")
    text = utf8_text(as_aiohttp_decodes)
    text.encode("utf-8")  # never raises
    assert text == utf8_text(raw.decode("utf-8", "surrogateescape"))
    try:
        assert text == raw.decode("utf-8")  # valid UTF-8 is left alone
    except UnicodeDecodeError:
        assert "\\x" in text


def failure(attempt: int, message: str) -> dict:
    return {
        "attempt": attempt,
        "at": "2026-11-23T12:00:00+00:00",
        "type": "ValueError",
        "message": message,
        "traceback": "Traceback (most recent call last):\n" + "  line\n" * 11 + message,
    }


@pytest.mark.parametrize(("attempts", "message_chars"), [(5, 1000), (40, 1990), (1000, 1990), (2, 500_000)])
def test_a_long_error_history_still_fits_one_frame_and_names_each_kept_attempt(attempts, message_chars):
    """RabbitMQ's frame_max is 128 KiB; a bigger content header closed the worker's connection."""
    errors = tuple(failure(n, f"failed {n}: " + "é" * message_chars) for n in range(1, attempts + 1))
    message = to_amqp(replace(event(1.0), attempt=attempts + 1, errors=errors))
    encoded = frame.marshal(header.ContentHeader(0, len(message.body), message.properties), 1)
    assert len(encoded) < 131072 - 8
    carried = from_amqp(message.body, over_the_wire(message)).errors
    assert carried[0]["attempt"] == 1 and carried[-1]["attempt"] == attempts  # the first and the last
    assert carried[-1]["traceback"].endswith("é")  # the end of the last traceback
    assert all(
        error["type"] == "ValueError" and error["message"].startswith(f"failed {error['attempt']}") for error in carried
    )
    if attempts == 5:
        assert carried == errors  # a usual history is left as it is


def test_the_ingress_publishes_the_same_message_as_aio_pika_would():
    """amqp_properties (the ingress's publish straight through aiormq) carries
    what to_amqp's message does, but its own message id."""
    sent = replace(event(1_763_900_000.5), attempt=2, errors=({"attempt": 1, "type": "E"},), route="billing")
    direct, through_aio_pika = amqp_properties(sent), to_amqp(sent).properties
    assert direct.headers == through_aio_pika.headers
    assert (direct.content_type, direct.delivery_mode) == (through_aio_pika.content_type, 2)
    assert direct.message_id and direct.message_id != through_aio_pika.message_id
    assert from_amqp(sent.body, over_the_wire_properties(direct)) == sent


def over_the_wire_properties(properties) -> dict:
    encoded = frame.marshal(header.ContentHeader(0, 0, properties), 1)
    return frame.unmarshal(encoded)[2].properties.headers
