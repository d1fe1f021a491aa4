"""Ordering keys' rows as Python sees them (shared/ordering/model.py): a row
carries its event as the outbox does, and a lane names its key's value."""

from dataclasses import replace
from decimal import Decimal

from tests.support.events import make_event
from webhook_ingest.shared.event.ordered import OrderedStep
from webhook_ingest.shared.ordering import event_of, lane_value, ordered_row


def test_a_row_carries_its_event_back_whole_but_its_step():
    event = replace(make_event("acme", "e1"), route="billing", key="acme:e1#billing", arrival=5, replay_of=2, attempt=3)
    event = replace(event, received_at=round(event.received_at, 3))  # the wire's milliseconds
    row = ordered_row(replace(event, ordered=OrderedStep("acme#billing:x", 1, 1, None)), "acme#billing:x", Decimal(7))
    assert (row.lane, row.source, row.route, row.key, row.arrival, row.replay_of) == (
        "acme#billing:x",
        "acme",
        "billing",
        "acme:e1#billing",
        5,
        2,
    )
    assert row.by_value == Decimal(7) and row.body == event.body
    assert event_of(row.body, row.amqp_headers) == event


def test_a_lane_splits_one_way():
    assert lane_value("acme:cus_1") == "cus_1"
    assert lane_value("acme#billing:a:b#c") == "a:b#c"
