"""An event's place in its lane (shared/event/ordered.py) is the holder's
knowledge, never the wire's: a message from the broker or the outbox has none."""

from dataclasses import replace
from decimal import Decimal

from pamqp import decode, encode

from tests.support.events import make_event
from webhook_ingest.shared.event.message import amqp_headers, from_amqp, to_amqp
from webhook_ingest.shared.event.ordered import OrderedStep

STEP = OrderedStep(lane="acme:cus_1", seq=7, token=12, by=Decimal(1700000000), stale=True)


def test_an_ordered_step_is_never_published():
    event = make_event("acme", "evt_1")
    ordered = replace(event, ordered=STEP)
    assert amqp_headers(ordered) == amqp_headers(event)


def test_a_message_read_back_has_no_step():
    message = to_amqp(replace(make_event("acme", "evt_1"), ordered=STEP))
    _, headers = decode.field_table(encode.field_table(message.headers))
    assert from_amqp(message.body, headers).ordered is None


def test_a_retry_keeps_its_step():
    ordered = replace(make_event("acme", "evt_1"), ordered=STEP)
    assert ordered.next_attempt({"attempt": 1}).ordered == STEP
    assert STEP.stale and OrderedStep("l", 1, 1, None).stale is False
