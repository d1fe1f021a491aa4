"""A source's routes (docs/reference.md §3 `routes`; why: docs/design.md,
"Routes"): one event, several handlers, each with its own filter.

A route is a name, a handler, its `handler_options` and the event types it
takes (globs, matched as an `ignore` rule's `type` values are, by the same
code: shared/sources/ignore_rules.py); without `types` it takes every event. The
worker that receives an event of a routed source publishes one message per
route that takes it, under the route's own idempotency key, `KEY#ROUTE`
(`route_key`): every exactly-once step — claim, lease, turn, completion,
attempts handed on, dead letter — is per key, so each (event, route) pair
is exactly once on its own, and a second fan-out of the same event only
makes copies of those keys.

A name is `[A-Za-z0-9_.-]`, at most 64 characters, unique in its source:
no `#`, so `KEY#ROUTE` is split at its last `#` into one pair only. Left
out, it is the handler's reference with every other character as `-`
(`billing:on_invoice` -> `billing-on_invoice`).
"""

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from webhook_ingest.shared.event import ids as event_id

from . import ignore_rules
from . import ordering as ordering_rules

NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
SEPARATOR = "#"


class RouteError(ValueError):
    """A route the file gets wrong; `where` names it (`routes[1].types[0]`)."""

    def __init__(self, where: str, problem: str):
        super().__init__(problem)
        self.where = where


@dataclass(frozen=True)
class Route:
    name: str
    handler: str
    handler_options: dict[str, Any] = field(default_factory=dict)
    types: ignore_rules.IgnoreRules = field(default_factory=ignore_rules.IgnoreRules)  # no rules: every event
    ordering: ordering_rules.OrderingRule | None = None  # None: the source's (Source.ordering_for)

    def takes(self, headers: Mapping[str, str], payload: object) -> bool:
        return not self.types.rules or self.types.matching(headers, payload) is not None


def route_key(key: str, route: str) -> str:
    """The idempotency key of `route`'s run of the event keyed `key`."""
    return f"{key}{SEPARATOR}{route}"


def derived_name(handler: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "-", handler)[:64]


def parse(entries: Sequence[Mapping[str, Any]], event_type: Sequence[event_id.Selector]) -> tuple[Route, ...]:
    """The `routes` of a source whose event type selectors are `event_type`;
    RouteError naming the route and field otherwise."""
    routes: list[Route] = []
    for index, entry in enumerate(entries):
        route = _route(index, entry, event_type)
        if any(known.name == route.name for known in routes):
            hint = "" if "name" in entry else " (derived from its handler: give each route a name)"
            raise RouteError(f"routes[{index}].name", f"{route.name!r} is already a route of this source{hint}")
        routes.append(route)
    return tuple(routes)


def _route(index: int, entry: Mapping[str, Any], event_type: Sequence[event_id.Selector]) -> Route:
    where = f"routes[{index}]"
    name = entry.get("name", derived_name(entry["handler"]))
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise RouteError(
            f"{where}.name", f"{name!r}: 1 to 64 of A-Z a-z 0-9 _ . - (it ends the route's idempotency keys, KEY#NAME)"
        )
    ordering = _ordering(where, entry.get("ordering"))
    types = entry.get("types")
    if types == []:
        raise RouteError(
            f"{where}.types", "an empty list takes no event: list the types, or leave types out (every event)"
        )
    if types is None:
        return Route(name, entry["handler"], dict(entry.get("handler_options", {})), ordering=ordering)
    try:
        rules = ignore_rules.parse({ignore_rules.TYPE_FIELD: types}, event_type)
    except ignore_rules.IgnoreRuleError as exc:
        at = exc.where.removeprefix(ignore_rules.TYPE_FIELD)
        raise RouteError(
            f"{where}.types{at}", str(exc).replace("ignore on a selector such as body:type", "drop types (every event)")
        ) from None
    return Route(name, entry["handler"], dict(entry.get("handler_options", {})), rules, ordering)


def _ordering(where: str, table: object) -> ordering_rules.OrderingRule | None:
    try:
        return ordering_rules.parse_optional(table)
    except ordering_rules.OrderingError as exc:
        raise RouteError(f"{where}.{exc.where}", str(exc)) from None
