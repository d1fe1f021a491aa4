"""A source's `ignore` rules (docs/reference.md §3): events its operator
does not want processed, answered 200 `ignored` once their signature
verified, archived with the rule that matched, and never queued.

A rule is a field and the values that make an event ignored. The field is
`type`, the source's event type (shared/event/types.py), or a selector
written as `event_id`'s (§5): `header:NAME`, `body:dotted.path`, a
template. A string value is a glob (fnmatch: `*`, `?`, `[...]`,
case-sensitive); true, false and numbers match JSON's own, typed, so a
`livemode` of `false` is neither the string "false" nor 0 (to Python,
`False == 0`). An event is ignored when any rule's field holds any of its
values; the first such value, in the file's order, names the rule
(`type=charge.*`), in the answer, the archive and the metric's label, so
the label's values are as few as the file's.

Compiled once at start-up — selectors to look-ups, globs to regular
expressions — so a request costs look-ups and a match; a bad rule raises
`IgnoreRuleError` then, naming its field.
"""

import fnmatch
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from webhook_ingest.shared.event import ids as event_id
from webhook_ingest.shared.event import types as event_type

TYPE_FIELD = "type"
Value = str | bool | int | float


class IgnoreRuleError(ValueError):
    """A rule that cannot be compiled; `where` says which, as a key under `ignore`."""

    def __init__(self, field: str, problem: str, index: int | None = None):
        super().__init__(problem)
        self.where = field_name(field) + ("" if index is None else f"[{index}]")


@dataclass(frozen=True, slots=True)
class Pattern:
    written: Value
    name: str  # `field=value`, as the answer and the metric say it
    glob: re.Pattern | None = None  # for a string

    def matches(self, value: object) -> bool:
        if self.glob is not None:
            return isinstance(value, str) and self.glob.match(value) is not None
        if isinstance(self.written, bool) or isinstance(value, bool):
            return value is self.written
        return isinstance(value, int | float) and value == self.written


@dataclass(frozen=True, slots=True)
class IgnoreRule:
    field: str
    selector: event_id.Selector | None  # None: the event type
    patterns: tuple[Pattern, ...]


@dataclass(frozen=True, slots=True)
class IgnoreRules:
    rules: tuple[IgnoreRule, ...] = ()
    event_type: tuple[event_id.Selector, ...] = ()  # the source's, for `type` rules

    def matching(self, headers: Mapping[str, str], payload: object) -> str | None:
        """The name of the first rule the event matches, else None."""
        for rule in self.rules:
            value = self._value(rule, headers, payload)
            if value is None:
                continue
            for pattern in rule.patterns:
                if pattern.matches(value):
                    return pattern.name
        return None

    def read_unsigned_headers(self, signed_headers: Mapping[str, str | None]) -> bool:
        """Whether a rule reads a header the signature does not cover (beside the type, bound as such):
        its decision then binds the signed content (ingress/intake/content_bindings.py)."""
        return any(
            rule.selector is not None and event_id.reads_unsigned_header(rule.selector, signed_headers)
            for rule in self.rules
        )

    def _value(self, rule: IgnoreRule, headers: Mapping[str, str], payload: object) -> object:
        if rule.selector is None:
            return event_type.resolve(self.event_type, headers, payload)
        return event_id.selected_value(rule.selector, headers, payload)


def parse(table: Mapping[str, object], event_type_selectors: Sequence[event_id.Selector]) -> IgnoreRules:
    """A source's `ignore` table, compiled; IgnoreRuleError naming the field otherwise."""
    rules = tuple(_rule(field, values, bool(event_type_selectors)) for field, values in table.items())
    return IgnoreRules(rules, tuple(event_type_selectors))


def field_name(field: str) -> str:
    """The field as a TOML key under `ignore`: `ignore.type`, `ignore."body:data.id"`."""
    return field if re.fullmatch(r"[A-Za-z0-9_-]+", field) else json.dumps(field)


def _rule(field: str, values: object, has_event_type: bool) -> IgnoreRule:
    if field == TYPE_FIELD:
        if not has_event_type:
            raise IgnoreRuleError(
                field,
                "the source has no event type (event_type is [], or unset and its scheme"
                " names none): set event_type, or ignore on a selector such as body:type",
            )
        selector = None
    else:
        try:
            [selector] = event_id.parse_selectors([field])
        except event_id.SelectorError as exc:
            raise IgnoreRuleError(field, f"{exc} (a rule's field is 'type' or a selector)") from None
    if not isinstance(values, list):
        return IgnoreRule(field, selector, (_pattern(field, None, values),))
    if not values:
        raise IgnoreRuleError(field, "an empty list ignores nothing: list the values to ignore, or drop the rule")
    return IgnoreRule(field, selector, tuple(_pattern(field, n, value) for n, value in enumerate(values)))


def _pattern(field: str, index: int | None, value: object) -> Pattern:
    if isinstance(value, str):
        return Pattern(value, f"{field}={value}", re.compile(fnmatch.translate(value)))
    if isinstance(value, bool | int) or (isinstance(value, float) and math.isfinite(value)):
        return Pattern(value, f"{field}={json.dumps(value)}")
    raise IgnoreRuleError(field, f"{value!r}: a value is a string (a glob), true, false or a finite number", index)
