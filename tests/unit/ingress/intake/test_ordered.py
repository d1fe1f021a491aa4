"""ingress/intake/ordered.py: where an event of an ordered source or route
goes — rows of its lanes, and the event to publish for what is not ordered
(docs/design.md, "Ordering keys")."""

from decimal import Decimal

from tests.support.events import make_event
from webhook_ingest.ingress.intake.ordered import Laned, laned
from webhook_ingest.shared.observability import metrics
from webhook_ingest.shared.ordering import event_of
from webhook_ingest.shared.sources.model import parse_source

BASE = {"scheme": "stripe", "secrets": ["s"]}


def source(name: str, **extra):
    return parse_source(name, {**BASE, **({} if "routes" in extra else {"handler": "inbox"}), **extra})


def unkeyed(name: str) -> float:
    return metrics.ordering_unkeyed.labels(name)._value.get()


def test_an_ordered_sources_event_is_one_row_of_its_lane_and_nothing_to_publish():
    ordered = source("ord_a", ordering={"key": "body:object", "by": "body:created"})
    event = make_event("ord_a", "evt_1", {"object": "o1", "created": 1700000000})
    found = laned(ordered, event, {"object": "o1", "created": 1700000000})
    assert found.unordered is None
    [row] = found.rows
    assert (row.lane, row.source, row.route, row.key, row.by_value) == (
        "ord_a:o1",
        "ord_a",
        "",
        event.key,
        Decimal(1700000000),
    )
    assert event_of(row.body, row.amqp_headers).key == event.key


def test_a_source_without_ordering_publishes_as_today():
    plain = source("ord_b")
    event = make_event("ord_b", "evt_1", {"object": "o1"})
    assert laned(plain, event, {"object": "o1"}) == Laned((), event)


def test_a_key_that_resolves_to_nothing_is_published_unordered_and_counted():
    ordered = source("ord_c", ordering={"key": "body:object"})
    before = unkeyed("ord_c")
    event = make_event("ord_c", "evt_1")
    found = laned(ordered, event, {"id": "evt_1"})
    assert (found.rows, found.unordered) == ((), event)
    assert unkeyed("ord_c") == before + 1


def test_a_routed_event_is_a_row_per_ordered_route_taking_it_and_one_message_for_the_others():
    routed = source(
        "ord_d",
        routes=[
            {"name": "billing", "handler": "inbox", "ordering": {"key": "body:object"}},
            {"name": "audit", "handler": "inbox"},
            {"name": "invoices", "handler": "inbox", "types": ["invoice.*"], "ordering": {"key": "body:object"}},
        ],
    )
    payload = {"id": "evt_1", "type": "customer.updated", "object": "o1"}
    event = make_event("ord_d", "evt_1", payload)
    found = laned(routed, event, payload)
    assert [(row.lane, row.route, row.key) for row in found.rows] == [
        ("ord_d#billing:o1", "billing", "ord_d:evt_1#billing")
    ]
    assert event_of(found.rows[0].body, found.rows[0].amqp_headers).route == "billing"
    assert found.unordered is not None
    assert (found.unordered.key, found.unordered.route, found.unordered.laned_routes) == (event.key, "", ("billing",))


def test_a_routed_event_all_of_whose_routes_are_ordered_publishes_nothing():
    routed = source(
        "ord_e",
        ordering={"key": "body:object"},
        routes=[
            {"name": "one", "handler": "inbox"},
            {"name": "two", "handler": "inbox", "ordering": {"key": "body:id"}},
        ],
    )
    payload = {"id": "evt_1", "object": "o1"}
    found = laned(routed, make_event("ord_e", "evt_1", payload), payload)
    assert [row.lane for row in found.rows] == ["ord_e#one:o1", "ord_e#two:evt_1"]
    assert found.unordered is None


def test_an_ordered_route_whose_key_resolves_to_nothing_is_fanned_out_unordered():
    routed = source(
        "ord_f",
        routes=[
            {"name": "one", "handler": "inbox", "ordering": {"key": "body:object"}},
            {"name": "two", "handler": "inbox"},
        ],
    )
    before = unkeyed("ord_f")
    event = make_event("ord_f", "evt_1")
    found = laned(routed, event, {"id": "evt_1"})
    assert found.rows == ()
    assert found.unordered is not None and found.unordered.laned_routes == ()
    assert unkeyed("ord_f") == before + 1
