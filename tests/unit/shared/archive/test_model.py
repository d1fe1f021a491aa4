"""The event archive's pure parts (shared/archive/model.py, shared/event/types.py):
a source's retention and event type in the sources file, its tables' names,
the days it keeps, the rows each side writes."""

import dataclasses
import re
from datetime import UTC, date, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.events import make_event
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.errors import ConfigError
from webhook_ingest.shared.event import types as event_type
from webhook_ingest.shared.event.message import from_amqp, new_arrival, to_amqp
from webhook_ingest.shared.sources.model import parse_source
from webhook_ingest.shared.sources.retention import parse_retention

SECRETS = {
    "stripe": "whsec_x",
    "github": "g",
    "shopify": "s",
    "standard-webhooks": "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
    "paystack": "p",
    "hmac-sha256": "h",
}


def source(scheme: str = "github", **fields):
    return parse_source("acme", {"scheme": scheme, "secrets": [SECRETS[scheme]], "handler": "inbox", **fields})


# -- retention ---------------------------------------------------------------------


def test_a_source_keeps_its_events_seven_days_unless_it_says_otherwise():
    assert source().retention == timedelta(days=7)
    assert source(retention="30d").retention == timedelta(days=30)
    assert source(retention="36h").retention == timedelta(hours=36)
    assert source(retention="0d").retention == timedelta(0)  # not archived


@pytest.mark.parametrize(
    "value, problem",
    [
        ("30 days", "not a duration such as 30d, 12h or 0d"),
        ("-1d", "not a duration"),
        ("", "not a duration"),
        (30, "must be a duration string"),
    ],
)
def test_a_retention_that_is_not_a_duration_stops_start_up_naming_the_field(value, problem):
    with pytest.raises(ConfigError, match=rf"^source 'acme': retention: .*{problem}"):
        source(retention=value)


@given(st.integers(0, 999_999), st.sampled_from("smhd"))
def test_a_retention_is_a_number_and_a_unit(number, unit):
    seconds = {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    assert parse_retention(f"{number}{unit}") == timedelta(seconds=number * seconds)


# -- tables and days -----------------------------------------------------------------


@given(st.text(min_size=1).filter(lambda name: ":" not in name and "/" not in name))
def test_a_sources_tables_are_plain_names_within_postgres_limit(name):
    table = archive.source_table(name)
    day = archive.day_table(name, date(2026, 11, 25))
    assert re.fullmatch(r"event_archive_[a-z0-9_]*_[0-9a-f]{8}", table)
    assert day == f"{table}_20261125" and len(day.encode()) <= 63


def test_two_sources_that_read_alike_get_tables_of_their_own():
    assert archive.source_table("Acme") != archive.source_table("acme")
    assert archive.source_table("acme-eu") != archive.source_table("acme_eu")


NOON = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def test_a_day_goes_once_all_of_it_is_older_than_the_retention():
    oldest, first, last = archive.kept_days(NOON, timedelta(days=7))
    assert oldest == date(2026, 11, 18)  # 18 Nov 12:00 is 7 days ago: that day is still partly within
    assert (first, last) == (date(2026, 11, 24), date(2026, 11, 28))  # from yesterday, three days ahead
    assert archive.kept_days(NOON, timedelta(hours=12))[:2] == (date(2026, 11, 25), date(2026, 11, 25))


def test_a_retention_of_zero_keeps_and_makes_nothing():
    oldest, first, last = archive.kept_days(NOON, timedelta(0))
    assert oldest > date(2026, 11, 28) and first > last


# -- rows ----------------------------------------------------------------------------


def test_both_sides_name_a_row_by_the_receive_time_and_the_arrival_the_message_carries():
    event = dataclasses.replace(make_event("acme", "evt_1"), arrival=new_arrival())
    carried = from_amqp(event.body, to_amqp(next_attempt(event)).headers)  # a retry, as a worker reads it
    arrival = archive.arrival_row(event, "push", "{}", archive.QUEUED)
    outcome = archive.outcome_row(carried, archive.PROCESSED, at=event.received_at + 1)
    assert (
        archive.row_key(arrival)
        == archive.row_key(outcome)
        == ("acme", "acme:evt_1", round(event.received_at * 1000), event.arrival)
    )


def test_two_copies_received_in_one_millisecond_are_two_rows():
    first = dataclasses.replace(make_event("acme", "evt_1"), arrival=new_arrival())
    copy = dataclasses.replace(first, arrival=new_arrival())
    rows = [archive.arrival_row(event, "push", "{}", archive.QUEUED) for event in (first, copy)]
    assert archive.row_key(rows[0]) != archive.row_key(rows[1])
    assert archive.rounds(rows) == [rows]  # one statement writes both


def next_attempt(event):
    return event.next_attempt({"attempt": 1, "at": 0, "type": "RuntimeError", "message": "500"})


@given(st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from("xy"), st.integers(0, 2), st.integers())))
def test_rounds_never_hold_a_row_twice_and_keep_the_order(rows):
    rounds = archive.rounds(rows)
    assert sorted(row for batch in rounds for row in batch) == sorted(rows)
    for batch in rounds:
        assert len({archive.row_key(row) for row in batch}) == len(batch)
    for key in {archive.row_key(row) for row in rows}:
        in_rounds = [row for batch in rounds for row in batch if archive.row_key(row) == key]
        assert in_rounds == [row for row in rows if archive.row_key(row) == key]


# -- event types ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "scheme, headers, payload, expected",
    [
        ("stripe", {}, {"id": "evt_1", "type": "invoice.paid"}, "invoice.paid"),
        ("github", {"x-github-event": "push"}, {"ref": "main"}, "push"),
        ("shopify", {"x-shopify-topic": "orders/create"}, {"id": 1}, "orders/create"),
        ("standard-webhooks", {}, {"type": "user.created", "data": {}}, "user.created"),
        ("paystack", {}, {"event": "charge.success", "data": {}}, "charge.success"),
        ("hmac-sha256", {"x-event-type": "ping"}, {"type": "invoice.paid"}, "invoice.paid"),  # the signed body's first
        ("hmac-sha256", {"x-event-type": "ping"}, {"id": 1}, "ping"),
        ("github", {}, {"type": "not github's"}, None),
    ],
)
def test_each_provider_names_its_event_type_where_it_puts_it(scheme, headers, payload, expected):
    assert event_type.resolve(source(scheme).event_type_selectors, headers, payload) == expected


def test_a_source_says_where_its_event_type_is():
    by_header = source("hmac-sha256", event_type="header:X-Kind")
    by_body = source("hmac-sha256", event_type=["body:meta.kind", "body:kind"])
    assert event_type.resolve(by_header.event_type_selectors, {"x-kind": "a"}, {"type": "b"}) == "a"
    assert event_type.resolve(by_body.event_type_selectors, {}, {"kind": 7}) == "7"
    assert event_type.resolve(source("hmac-sha256", event_type=[]).event_type_selectors, {}, {"type": "b"}) is None
    with pytest.raises(ConfigError, match=r"^source 'acme': event_type: "):
        source(event_type=["cookie:x"])


def test_an_event_type_is_cut_never_refused():
    long = "x" * 1000
    assert event_type.resolve(source("stripe").event_type_selectors, {}, {"type": long}) == long[:200]
