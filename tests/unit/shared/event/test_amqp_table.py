"""shared/event/amqp_table.py writes the bytes pamqp writes: the message format
does not change with it."""

import time

from hypothesis import given
from hypothesis import strategies as st
from pamqp import encode
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from webhook_ingest.shared.event import amqp_table
from webhook_ingest.shared.event.message import EventMessage, amqp_headers, new_arrival, new_message_id

names = st.text(min_size=1, max_size=140)  # past 128 bytes pamqp cuts the name
values = st.recursive(
    st.text(max_size=60)
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.booleans()
    | st.floats(allow_nan=False, width=32)
    | st.none(),
    lambda inner: st.dictionaries(names, inner, max_size=4) | st.lists(inner, max_size=3),
    max_leaves=12,
)
tables = st.dictionaries(names, values, max_size=8)


@given(tables)
def test_any_table_is_encoded_as_pamqp_encodes_it(table):
    assert amqp_table.field_table(table) == encode.field_table(table)


@given(tables, st.text(max_size=40), st.sampled_from([None, 1, 2]), st.text(max_size=40))
def test_any_properties_are_marshalled_as_pamqp_marshals_them(headers, content_type, delivery_mode, message_id):
    arguments = {
        "content_type": content_type,
        "headers": headers,
        "delivery_mode": delivery_mode,
        "message_id": message_id,
        "priority": 0,
    }
    assert (
        ContentHeader(0, 10, amqp_table.Properties(**arguments)).marshal()
        == ContentHeader(0, 10, Basic.Properties(**arguments)).marshal()
    )


def test_an_event_message_is_marshalled_as_pamqp_marshals_it():
    event = EventMessage(
        key="acme:evt_1",
        source="acme",
        event_id="evt_1",
        payload_sha256="0" * 64,
        received_at=time.time(),
        body=b"{}",
        arrival=new_arrival(),
        headers={"content-type": "application/json", "stripe-signature": "t=1,v1=ab", "é": "ü"},
    )
    arguments = {
        "content_type": "application/json",
        "delivery_mode": 2,
        "message_id": new_message_id(),
        "headers": amqp_headers(event),
    }
    assert amqp_table.Properties(**arguments).marshal() == Basic.Properties(**arguments).marshal()
