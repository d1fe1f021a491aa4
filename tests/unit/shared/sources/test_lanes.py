"""shared/sources/lanes.py: which lanes, and which `by`, an event of an
ordered source gets — the ingress's and a replay by selection's one answer
(their own sides: tests/unit/ingress/intake/test_ordered.py,
tests/integration/shared/replays/test_ordered.py)."""

from dataclasses import replace

from tests.support.events import make_event
from webhook_ingest.shared.ordering import event_of
from webhook_ingest.shared.sources import laned
from webhook_ingest.shared.sources.model import parse_source

ROUTES = [
    {"name": "billing", "handler": "inbox", "ordering": {"key": "body:object", "by": "body:version"}},
    {"name": "audit", "handler": "inbox"},
    {"name": "invoices", "handler": "inbox", "types": ["invoice.*"], "ordering": {"key": "body:object"}},
]
ROUTED = parse_source("lanes_a", {"scheme": "stripe", "secrets": ["s"], "routes": ROUTES})


def test_rows_carry_the_event_as_given_and_the_rest_is_published_naming_the_laned_routes():
    payload = {"id": "evt_1", "type": "customer.updated", "object": "o1", "version": 3}
    event = make_event("lanes_a", "evt_1", payload)
    found = laned(ROUTED, event, payload, lambda each: replace(each, trace_context={"traceparent": "00-x"}))
    [row] = found.rows
    assert (row.lane, row.route, row.key, row.by_value) == ("lanes_a#billing:o1", "billing", "lanes_a:evt_1#billing", 3)
    assert event_of(row.body, row.amqp_headers).trace_context == {"traceparent": "00-x"}
    assert found.unordered == replace(event, laned_routes=("billing",))  # as received: no span of the rows'
    assert found.unkeyed == ()


def test_an_unkeyed_ordered_route_is_named_and_fanned_out():
    payload = {"id": "evt_1", "type": "invoice.paid"}
    event = make_event("lanes_a", "evt_1", payload)
    found = laned(ROUTED, event, payload)
    assert (found.rows, found.unordered, found.unkeyed) == ((), event, ("billing", "invoices"))


def test_an_event_no_route_takes_is_published_as_an_unordered_sources_the_worker_finds_unrouted():
    only_invoices = parse_source("lanes_b", {"scheme": "stripe", "secrets": ["s"], "routes": ROUTES[2:]})
    payload = {"id": "evt_1", "type": "customer.updated", "object": "o1"}
    event = make_event("lanes_b", "evt_1", payload)
    found = laned(only_invoices, event, payload)
    assert (found.rows, found.unordered, found.unkeyed) == ((), event, ())
