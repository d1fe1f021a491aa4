"""A source's or a route's `ordering` (docs/design.md,
"Ordering keys"): which events of it run one after another.

    [sources.stripe.ordering]
    key = "body:data.object.id"   # a selector, or a list: the first that resolves
    by = "body:created"           # optional: a number, or an ISO 8601 time
    hold = "2s"                   # with `by` only: "500ms", "2s", "1m"; at most "1h"
    stale = "run"                 # or "skip" (needs `by`)
    on_dead_letter = "block"      # or "skip"

`key` and `by` are selectors exactly as `event_id`'s (docs/reference.md §5:
`header:NAME`, `body:dotted.path`, a `{...}` template for a compound key).
The events of one key's value form a *lane*, `SOURCE[#ROUTE]:VALUE`: a
routed source's lanes are per route (`routes[i].ordering` replaces the
source's for that route), so one route's dead letter never blocks another.
A value over MAX_LANE_VALUE_BYTES becomes `sha256:HEX`. An event whose key
resolves to nothing has no lane: it takes the unordered path.

`by` reads a JSON number (or a numeric string) as it is and an ISO 8601
time as unix seconds; anything else is None: the row runs after the lane's
dated ones and is never stale.
"""

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from webhook_ingest.shared.event import ids as event_id

MAX_LANE_VALUE_BYTES = 1024  # a lane stays within a btree entry, and within an AMQP header
MAX_HOLD_SECONDS = 3600.0
STALE_CHOICES = ("run", "skip")
ON_DEAD_LETTER_CHOICES = ("block", "skip")
FIELDS = ("key", "by", "hold", "stale", "on_dead_letter")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class OrderingError(ValueError):
    """An `ordering` table the file gets wrong; `where` names the field (`ordering.hold`)."""

    def __init__(self, where: str, problem: str):
        super().__init__(problem)
        self.where = where


@dataclass(frozen=True)
class OrderingRule:
    key: tuple[event_id.Selector, ...]
    by: event_id.Selector | None = None
    hold_seconds: float = 0.0
    stale: str = "run"
    on_dead_letter: str = "block"

    def lane(self, source: str, route: str, headers: Mapping[str, str], payload: object) -> str | None:
        """`SOURCE[#ROUTE]:VALUE` of the event's key (route "": the source's own); None: no key."""
        value = event_id.resolve_event_id(self.key, headers, payload)
        if value is None:
            return None
        return f"{source}#{route}:{lane_value(value)}" if route else f"{source}:{lane_value(value)}"

    def by_value(self, headers: Mapping[str, str], payload: object) -> Decimal | None:
        """The event's `by`, a number; None without `by`, or when it is not one."""
        if self.by is None:
            return None
        return by_number(event_id.selected_value(self.by, headers, payload))


def lane_value(value: str) -> str:
    """The key's value as its lane names it: over MAX_LANE_VALUE_BYTES, its SHA-256."""
    encoded = value.encode("utf-8", "surrogatepass")
    if len(encoded) <= MAX_LANE_VALUE_BYTES:
        return value
    return f"sha256:{hashlib.sha256(encoded).hexdigest()}"


def by_number(value: object) -> Decimal | None:
    """A JSON number as it is, a numeric string as its number, an ISO 8601 time as unix seconds; else None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return _finite(Decimal(str(value)))
    if not isinstance(value, str):
        return None
    try:
        return _finite(Decimal(value.strip()))
    except InvalidOperation:
        return _iso_seconds(value.strip())


# Postgres's numeric holds far more, but a value asyncpg cannot encode would fail the whole
# group commit its request shares: a `by` is a time or a version, never a thousand digits.
MAX_BY_DIGITS = 1000


def _finite(number: Decimal) -> Decimal | None:
    """The number, if it is one a lane can be ordered by; else None (read as no `by`)."""
    if not number.is_finite():
        return None
    if len(number.as_tuple().digits) > MAX_BY_DIGITS or abs(number.adjusted()) > MAX_BY_DIGITS:
        return None
    return number


def _iso_seconds(text: str) -> Decimal | None:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)  # a time without an offset is read as UTC
    whole = int((moment - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds() // 1)
    return Decimal(whole) + Decimal(moment.microsecond) / 1_000_000


def parse(table: object) -> OrderingRule:
    """An `ordering` table's rule; OrderingError naming the field otherwise."""
    if not isinstance(table, Mapping):
        raise OrderingError("ordering", 'must be a table { key = "body:PATH" }')
    unknown = sorted(set(table) - set(FIELDS))
    if unknown:
        raise OrderingError(f"ordering.{unknown[0]}", f"unknown field (known: {', '.join(sorted(FIELDS))})")
    by = _by(table.get("by"))
    hold = _hold(table.get("hold"))
    stale = _choice("stale", table.get("stale", "run"), STALE_CHOICES)
    if by is None and "hold" in table:
        raise OrderingError("ordering.hold", "needs ordering.by (what to order the held events by)")
    if by is None and stale == "skip":
        raise OrderingError("ordering.stale", '"skip" needs ordering.by (what makes an event stale)')
    return OrderingRule(
        key=_key(table.get("key")),
        by=by,
        hold_seconds=hold,
        stale=stale,
        on_dead_letter=_choice("on_dead_letter", table.get("on_dead_letter", "block"), ON_DEAD_LETTER_CHOICES),
    )


def _key(value: object) -> tuple[event_id.Selector, ...]:
    if value is None:
        raise OrderingError("ordering.key", 'is required (a selector such as "body:data.object.id", or a list)')
    specs = [value] if isinstance(value, str) else value
    if not isinstance(specs, list) or not specs:
        raise OrderingError("ordering.key", "must be a selector string or a non-empty list of them")
    try:
        return event_id.parse_selectors(specs)
    except event_id.SelectorError as exc:
        raise OrderingError("ordering.key", str(exc)) from None


def _by(value: object) -> event_id.Selector | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise OrderingError("ordering.by", 'must be one selector string such as "body:created"')
    try:
        return event_id.parse_selectors([value])[0]
    except event_id.SelectorError as exc:
        raise OrderingError("ordering.by", str(exc)) from None


def _hold(value: object) -> float:
    if value is None:
        return 0.0
    found = _DURATION.fullmatch(value) if isinstance(value, str) else None
    if found is None:
        raise OrderingError("ordering.hold", f'must be a duration such as "500ms", "2s" or "1m", got {value!r}')
    seconds = float(found[1]) * _UNIT_SECONDS[found[2]]
    if seconds > MAX_HOLD_SECONDS:
        raise OrderingError("ordering.hold", f'at most "1h" (each event waits up to it), got {value!r}')
    return seconds


def _choice(name: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise OrderingError(f"ordering.{name}", f"must be {' or '.join(map(repr, choices))}, got {value!r}")
    return str(value)


def parse_optional(table: Any) -> OrderingRule | None:
    """`parse`, or None when the section has no `ordering`."""
    return None if table is None else parse(table)
