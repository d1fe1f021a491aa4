"""workers/fan_out.py: a routed event's fan-out skips the routes whose
lanes the ingress wrote it to (docs/design.md, "Ordering keys")."""

from dataclasses import replace

from tests.support.events import make_event
from webhook_ingest.shared.event.message import from_amqp, to_amqp
from webhook_ingest.shared.sources.model import parse_source
from webhook_ingest.workers.fan_out import route_messages

SOURCE = parse_source(
    "acme",
    {
        "scheme": "stripe",
        "secrets": ["s"],
        "routes": [
            {"name": "billing", "handler": "inbox", "ordering": {"key": "body:object"}},
            {"name": "audit", "handler": "inbox"},
            {"name": "mail", "handler": "inbox", "types": ["mail.*"]},
        ],
    },
)


def test_routes_the_ingress_laned_are_skipped_and_the_others_fanned_out():
    event = replace(make_event("acme", "evt_1", {"object": "o1"}), laned_routes=("billing",))
    received = to_amqp(event)
    messages = route_messages(SOURCE, from_amqp(received.body, received.headers))
    assert [(m.key, m.route, m.laned_routes) for m in messages] == [("acme:evt_1#audit", "audit", ())]


def test_an_event_without_laned_routes_goes_to_every_route_taking_it():
    """Queued by an ingress of an earlier release, or a key that resolved to nothing: unordered, as before."""
    messages = route_messages(SOURCE, make_event("acme", "evt_1", {"object": "o1"}))
    assert [m.route for m in messages] == ["billing", "audit"]


def test_laned_routes_travel_on_the_wire_only_when_there_are_some():
    event = make_event("acme", "evt_1")
    assert "x-laned-routes" not in to_amqp(event).headers
    wire = to_amqp(replace(event, laned_routes=("billing", "b.2")))
    assert wire.headers["x-laned-routes"] == "billing,b.2"
    assert from_amqp(wire.body, wire.headers).laned_routes == ("billing", "b.2")
