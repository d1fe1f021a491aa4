"""Pure parts of retries and dead letters: the message's counters, the
retry delays, the CLI's parsing and rendering. No services."""

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.support.events import make_event
from webhook_ingest.cli.dlq import age, parse_duration, render_table
from webhook_ingest.shared.dead_letters.model import MAX_ID, describe_error, parse_id, storable_payload
from webhook_ingest.shared.event.message import from_amqp, to_amqp
from webhook_ingest.shared.sources.model import parse_source
from webhook_ingest.workers.claim.retry import TRACEBACK_LINES, describe_failure


def test_attempt_errors_and_deliveries_travel_in_the_message():
    event = make_event("acme", "evt_1").next_attempt({"attempt": 1, "type": "E", "message": "m"})
    message = to_amqp(event)
    received = from_amqp(message.body, message.headers)
    assert (received.attempt, received.errors, received.deliveries) == (2, event.errors, 0)


def test_deliveries_add_the_queue_count_to_what_earlier_messages_carried():
    event = make_event("acme", "evt_1")
    headers = to_amqp(event).headers | {"x-deliveries": 3, "x-delivery-count": 2}
    redelivered = from_amqp(event.body, headers)
    assert redelivered.deliveries == 5
    assert to_amqp(redelivered).headers["x-deliveries"] == 5  # a deferral carries it on
    fresh = redelivered.next_attempt({"attempt": 1}).fresh()
    assert (fresh.attempt, fresh.errors, fresh.deliveries) == (1, (), 0)  # a replay starts over


def test_retry_delays_are_used_in_order_and_the_last_repeats():
    source = parse_source(
        "acme", {"scheme": "github", "secrets": ["s"], "handler": "inbox", "retry_delays": [1, 10, 60]}
    )
    assert [source.retry_delay(failed) for failed in range(1, 6)] == [1, 10, 60, 60, 60]


def test_a_failure_is_recorded_with_type_message_time_and_a_trimmed_traceback():
    def deep(n):
        if n == 0:
            raise ValueError("x" * 5000)
        deep(n - 1)

    try:
        deep(40)
    except ValueError as exc:
        error = describe_failure(exc, 3)
    assert (error["attempt"], error["type"], len(error["message"])) == (3, "ValueError", 2000)
    assert datetime.fromisoformat(error["at"]).tzinfo is not None
    assert error["traceback"].count("\n") <= TRACEBACK_LINES * 2 and "ValueError" in error["traceback"]


def test_last_error_reads_type_colon_message():
    assert describe_error({"type": "ForwardFailed", "message": "answered 500"}) == "ForwardFailed: answered 500"
    assert describe_error({"type": "KeyError", "message": ""}) == "KeyError"
    assert describe_error(None) is None


@pytest.mark.parametrize(
    "text, expected",
    [
        ("42", 42),
        (" 7 ", 7),
        ("0", 0),
        ("-1", None),
        ("+1", None),
        ("1.0", None),
        ("x", None),
        ("٣", None),
        (str(2**63), None),
    ],
)
def test_dead_letter_ids(text, expected):
    assert parse_id(text) == expected


def test_durations_and_ages():
    assert parse_duration("30d") == timedelta(days=30)
    assert parse_duration("90m") == timedelta(minutes=90)
    assert [age(timedelta(seconds=s)) for s in (5, 125, 7300, 200000, -3)] == ["5s", "2m", "2h", "2d", "0s"]


def test_only_json_postgres_can_store_becomes_the_readable_payload():
    assert storable_payload(b'{"a": 1}') == '{"a": 1}'
    for body in (b"\xff", b"not json", b'{"a": NaN}', b'{"a": "\\u0000"}'):
        assert storable_payload(body) is None, body


def test_the_table_has_one_line_per_dead_letter_and_trims_long_cells():
    now = datetime(2026, 1, 2, tzinfo=UTC)
    rows = [
        {
            "id": 7,
            "status": "replayed",
            "source": "acme",
            "key": "acme:" + "k" * 80,
            "attempts": 5,
            "created_at": now - timedelta(hours=3),
            "last_error": {"type": "E", "message": "m\nn"},
        }
    ]
    header, line = render_table(rows, now).splitlines()
    assert header.split() == ["ID", "STATUS", "SOURCE", "KEY", "ATTEMPTS", "AGE", "LAST", "ERROR"]
    assert line.split() == ["7", "replayed", "acme", "acme:" + "k" * 42 + "…", "5", "3h", "E:", "m", "n"]


# shared/dead_letters/model.parse_id: any user text is an id or None, never an
# error (issue 21, item 7: a 5,000-digit id or `limit` was a 500 — Python's
# int() refuses more than 4,300 digits).


def test_a_five_thousand_digit_id_is_no_id():
    assert parse_id("9" * 5000) is None
    assert parse_id("0" * 4999 + "7") is None  # too long to be one of ours, whatever its value


@given(st.text(alphabet="0123456789", min_size=1, max_size=6000))
def test_digits_of_any_length_are_an_id_in_range_or_none(text):
    parsed = parse_id(text)
    assert parsed is None or 0 <= parsed <= MAX_ID


@given(st.text(max_size=50))
def test_any_text_is_an_id_or_none(text):
    assert parse_id(text) is None or isinstance(parse_id(text), int)
