"""Where an event of a source goes when it or its routes are ordered
(docs/design.md, "Ordering keys"): a row in each lane it belongs to — the
source's own, or each route's that takes it and has an ordering whose key
resolves — and the event to publish for the rest (a source or route
without `ordering`, a key that resolves to nothing). The ingress asks it of
each request, a replay by selection of each item; the one place that says
which lane and which `by` an event gets.

A routed event published beside rows names their routes
(`EventMessage.laned_routes`): the worker's fan-out skips those, so a
route's event runs only through its lane.
"""

from collections.abc import Callable
from dataclasses import dataclass, replace

from webhook_ingest.shared.event import EventMessage
from webhook_ingest.shared.ordering import OrderedRow, ordered_row

from .model import Source
from .ordering import OrderingRule
from .routes import route_key


@dataclass(frozen=True)
class Laned:
    rows: tuple[OrderedRow, ...]  # to insert, one per lane the event goes to
    unordered: EventMessage | None  # to publish as for an unordered source; None: nothing is
    unkeyed: tuple[str, ...] = ()  # the routes ("": the source's own) whose ordering key resolved to nothing


def _same(event: EventMessage) -> EventMessage:
    return event


def laned(
    source: Source, event: EventMessage, payload: object, carried: Callable[[EventMessage], EventMessage] = _same
) -> Laned:
    """Where `event` of `source` goes; `payload`: the body as read (the routes'
    filters and the keys read it); `carried`: the event as its rows carry it
    (the ingress's: with its request's span)."""
    if not source.ordered:
        return Laned((), event)
    if not source.routes:
        row = _row(source.ordering, source.name, "", event, payload, carried)
        return Laned((row,), None) if row is not None else Laned((), event, ("",))
    rows: list[OrderedRow] = []
    unkeyed: list[str] = []
    unordered = False
    for route in source.routes_taking(event.headers, payload):
        rule = source.ordering_for(route.name)
        routed = replace(event, key=route_key(event.key, route.name), route=route.name)
        row = _row(rule, source.name, route.name, routed, payload, carried)
        if row is None:
            unordered = True  # the worker fans the published event out to this route
            if rule is not None:
                unkeyed.append(route.name)
        else:
            rows.append(row)
    if not rows:  # as an unordered source's: the worker fans it out (or finds that no route takes it)
        return Laned((), event, tuple(unkeyed))
    if not unordered:
        return Laned(tuple(rows), None, tuple(unkeyed))
    return Laned(tuple(rows), replace(event, laned_routes=tuple(row.route for row in rows)), tuple(unkeyed))


def _row(
    rule: OrderingRule | None,
    source: str,
    route: str,
    event: EventMessage,
    payload: object,
    carried: Callable[[EventMessage], EventMessage],
) -> OrderedRow | None:
    """The event's row in its lane under `rule`; None: not ordered, or its key resolves to nothing."""
    if rule is None:
        return None
    lane = rule.lane(source, route, event.headers, payload)
    if lane is None:
        return None
    return ordered_row(carried(event), lane, rule.by_value(event.headers, payload))
