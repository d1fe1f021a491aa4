"""A source's `ordering` (shared/sources/ordering.py): the file's syntax, its
one-line start-up refusals, and the lane and `by` each event gets."""

from decimal import Decimal

import pytest

from webhook_ingest.shared.errors import ConfigError
from webhook_ingest.shared.sources.model import parse_source
from webhook_ingest.shared.sources.ordering import MAX_LANE_VALUE_BYTES, OrderingRule, by_number, parse

BASE = {"scheme": "stripe", "secrets": ["s"], "handler": "inbox"}


def rule(**table) -> OrderingRule:
    return parse({"key": "body:data.object.id", **table})


def test_a_source_without_ordering_has_none():
    source = parse_source("acme", BASE)
    assert source.ordering is None and source.ordering_for("") is None


def test_the_defaults_run_stale_events_and_block_on_a_dead_letter():
    ordering = parse_source("acme", {**BASE, "ordering": {"key": "body:data.object.id"}}).ordering
    assert ordering is not None
    assert (ordering.by, ordering.hold_seconds, ordering.stale, ordering.on_dead_letter) == (None, 0.0, "run", "block")


@pytest.mark.parametrize(
    ("hold", "seconds"), [("500ms", 0.5), ("2s", 2.0), ("1.5s", 1.5), ("1m", 60.0), ("1h", 3600.0)]
)
def test_hold_reads_milliseconds_seconds_minutes_and_hours(hold, seconds):
    assert rule(by="body:created", hold=hold).hold_seconds == seconds


def test_a_route_has_its_own_ordering_or_the_sources():
    source = parse_source(
        "acme",
        {
            "scheme": "stripe",
            "secrets": ["s"],
            "ordering": {"key": "body:customer"},
            "routes": [
                {"name": "a", "handler": "inbox"},
                {"name": "b", "handler": "inbox", "ordering": {"key": "body:id", "on_dead_letter": "skip"}},
            ],
        },
    )
    assert source.ordering_for("a") is source.ordering
    own = source.ordering_for("b")
    assert own is not None and own is not source.ordering and own.on_dead_letter == "skip"
    assert own.lane("acme", "b", {}, {"id": "o1"}) == "acme#b:o1"


@pytest.mark.parametrize(
    ("ordering", "where", "problem"),
    [
        ({}, "ordering.key", "is required"),
        ({"key": []}, "ordering.key", "non-empty list"),
        ({"key": "nowhere:x"}, "ordering.key", "must be header:NAME, body:dotted.path or a {...} template"),
        ({"key": "{body.a"}, "ordering.key", "unbalanced braces"),
        ({"key": "body:id", "hold": "2s"}, "ordering.hold", "needs ordering.by"),
        ({"key": "body:id", "stale": "skip"}, "ordering.stale", '"skip" needs ordering.by'),
        ({"key": "body:id", "by": "body:t", "hold": "2 s"}, "ordering.hold", "must be a duration"),
        ({"key": "body:id", "by": "body:t", "hold": "2h"}, "ordering.hold", 'at most "1h"'),
        ({"key": "body:id", "by": "body:t", "hold": 2}, "ordering.hold", "must be a duration"),
        ({"key": "body:id", "by": ["body:t"]}, "ordering.by", "must be one selector string"),
        ({"key": "body:id", "stale": "drop"}, "ordering.stale", "must be 'run' or 'skip', got 'drop'"),
        ({"key": "body:id", "on_dead_letter": "park"}, "ordering.on_dead_letter", "must be 'block' or 'skip'"),
        ({"key": "body:id", "order": "x"}, "ordering.order", "unknown field (known: by, hold, key,"),
        ("body:id", "ordering", "must be a table"),
    ],
)
def test_each_mistake_stops_start_up_in_one_line_naming_the_field(ordering, where, problem):
    with pytest.raises(ConfigError) as raised:
        parse_source("stripe", {**BASE, "ordering": ordering})
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"source 'stripe': {where}: ") and problem in message


def test_a_routes_mistake_names_the_route():
    section = {
        "scheme": "stripe",
        "secrets": ["s"],
        "routes": [{"handler": "inbox", "ordering": {"key": "body:id", "hold": "1s"}}],
    }
    with pytest.raises(ConfigError, match=r"^source 'acme': routes\[0\]\.ordering\.hold: needs ordering\.by"):
        parse_source("acme", section)


def test_the_lane_is_source_route_and_the_first_key_that_resolves():
    ordering = parse({"key": ["body:data.object.id", "header:X-Object"]})
    assert ordering.lane("acme", "", {}, {"data": {"object": {"id": "cus_1"}}}) == "acme:cus_1"
    assert ordering.lane("acme", "billing", {"x-object": "o2"}, {"data": {}}) == "acme#billing:o2"
    assert ordering.lane("acme", "", {}, {"data": {"object": {"id": ""}}}) is None  # empty is absent
    assert ordering.lane("acme", "", {}, {}) is None


def test_a_template_makes_a_compound_key():
    ordering = parse({"key": "{body.account}/{body.object.id}"})
    assert ordering.lane("acme", "", {}, {"account": "a1", "object": {"id": 7}}) == "acme:a1/7"
    assert ordering.lane("acme", "", {}, {"account": "a1"}) is None


def test_a_long_value_becomes_its_sha256():
    long = "x" * (MAX_LANE_VALUE_BYTES + 1)
    lane = rule().lane("acme", "", {}, {"data": {"object": {"id": long}}})
    assert lane is not None and lane.startswith("acme:sha256:") and len(lane) == len("acme:sha256:") + 64
    exact = "y" * MAX_LANE_VALUE_BYTES
    assert rule().lane("acme", "", {}, {"data": {"object": {"id": exact}}}) == f"acme:{exact}"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1700000000, Decimal(1700000000)),
        (1.5, Decimal("1.5")),
        ("42", Decimal(42)),
        ("2023-11-14T22:13:20Z", Decimal(1700000000)),
        ("2023-11-14T23:13:20.25+01:00", Decimal("1700000000.25")),
        ("2023-11-14T22:13:20", Decimal(1700000000)),  # no offset: UTC
        ("yesterday", None),
        ("NaN", None),
        ("Infinity", None),
        (True, None),
        (None, None),
        ({"a": 1}, None),
    ],
)
def test_by_reads_numbers_as_they_are_and_iso_times_as_unix_seconds(value, expected):
    assert by_number(value) == expected


def test_by_value_reads_the_selected_value():
    ordering = rule(by="body:created")
    assert ordering.by_value({}, {"created": 1700000000}) == Decimal(1700000000)
    assert ordering.by_value({}, {}) is None
    assert rule().by_value({}, {"created": 1}) is None  # no `by`
    assert rule(by="header:X-Sent-At").by_value({"x-sent-at": "2023-11-14T22:13:20Z"}, {}) == Decimal(1700000000)


@pytest.mark.parametrize("text", ["1e-20000", "1e20000", "9" * 1001])
def test_a_by_no_time_or_version_could_be_is_read_as_none(text):
    """A numeric string Postgres's numeric (or asyncpg) cannot take would
    fail every request of its group commit: read as no `by`, as unreadable."""
    assert by_number(text) is None
