"""The event message through pamqp's real wire encoding, as the broker sees it."""

from datetime import UTC, datetime, timedelta

import aio_pika
from hypothesis import given
from hypothesis import strategies as st
from pamqp import frame, header

from webhook_ingest.shared.message import EventMessage, from_amqp, to_amqp, utf8_text

# 2001-09-09 .. 2100-01-01 in milliseconds since the epoch (unix seconds as a
# float keep microseconds exact until about 2242)
received_ms = st.integers(min_value=1_000_000_000_000, max_value=4_102_444_800_000)


def event(received_at: float) -> EventMessage:
    return EventMessage(key="s:e1", source="s", event_id="e1", payload_sha256="0" * 64,
                        received_at=received_at, body=b'{"id":"e1"}', headers={"x-a": "1"})


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
        datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=milliseconds))


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
