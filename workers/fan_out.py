"""An event of a source with routes becomes one message per route that takes
it (docs/design.md, "Routes"; shared/sources/routes.py).

The worker that receives the event publishes them to the events queue,
each confirmed by the broker, and only then acks the event: a worker killed
in between leaves the event to be redelivered and fanned out again, whose
messages are then copies of route keys already queued or run — settled as
copies by each key's own exactly-once steps, never run twice.

A route with `ordering` whose lane the ingress wrote the event to is named
in the event's `laned_routes` and skipped here: it runs only in its lane
(docs/design.md, "Ordering keys"). An event without that list (queued by an
ingress of an earlier release, or whose key resolved to nothing) is fanned
out to every route that takes it, as before.
"""

import json
from dataclasses import replace

from webhook_ingest.shared.event import EventMessage, payloads
from webhook_ingest.shared.sources import Source, route_key


def route_messages(source: Source, event: EventMessage) -> list[EventMessage]:
    """`event`'s messages, one per route of `source` that takes it and whose
    lane does not hold it already, in the file's order."""
    taking = source.routes_taking(event.headers, _payload(event))
    routes = [route for route in taking if route.name not in event.laned_routes]
    # deliveries: the event's own redeliveries are not its routes' (each message counts its own)
    return [
        replace(event, key=route_key(event.key, route.name), route=route.name, deliveries=0, laned_routes=())
        for route in routes
    ]


def _payload(event: EventMessage) -> object:
    """The payload as the ingress read it for the same filters; None when it
    cannot be read (only routes without `types` take it then)."""
    try:
        if payloads.is_form(event.headers.get("content-type")):
            return payloads.parse_form(event.body)
        return json.loads(event.body)
    except ValueError:
        return None
