"""An outbox row holds the message the ingress would have published; the
relay publishes the event read back from it. Whatever travels through the
outbox must arrive as it would have straight through the broker."""

from hypothesis import given
from hypothesis import strategies as st

from tests.unit.shared.event.test_message import over_the_wire, received_ms
from webhook_ingest.ingress.publishing.outbox import decode_message, encode_message
from webhook_ingest.shared.event.message import EventMessage, from_amqp, to_amqp

text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
header_names = st.text("abcdefghijklmnopqrstuvwxyz-0123456789", min_size=1, max_size=30)

events = st.builds(
    EventMessage,
    key=text,
    source=text,
    event_id=text,
    payload_sha256=st.text("0123456789abcdef", min_size=64, max_size=64),
    received_at=received_ms.map(lambda ms: ms / 1000),
    body=st.binary(max_size=200),
    headers=st.dictionaries(header_names, text, max_size=6),
    arrival=st.integers(0, 2**63 - 1),  # the archive's row of the accepted request
)


@given(events)
def test_through_the_outbox_an_event_arrives_as_it_would_straight_through_the_broker(event):
    straight = from_amqp(event.body, over_the_wire(to_amqp(event)))
    through_the_outbox = from_amqp(event.body, over_the_wire(to_amqp(decode_message(*encode_message(event)))))
    assert through_the_outbox == straight == event


def test_the_row_holds_the_raw_body():
    event = EventMessage(
        key="s:1", source="s", event_id="1", payload_sha256="0" * 64, received_at=1.5, body=b'{"n": 1.0e0}', headers={}
    )
    body, _ = encode_message(event)
    assert body == b'{"n": 1.0e0}'
