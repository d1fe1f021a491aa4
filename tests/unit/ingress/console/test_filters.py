"""The console's filter parser (ingress/console/filters.py), whatever a URL
holds: a filter or plain problems, and the form's values round the URL."""

from datetime import UTC, datetime
from urllib.parse import parse_qsl

from hypothesis import given
from hypothesis import strategies as st

from webhook_ingest.ingress.console.filters import (
    FIELDS,
    MAX_TEXT,
    form_values,
    parse_before,
    parse_filter,
    query_string,
)
from webhook_ingest.shared.dead_letters.model import DeadLetterFilter

query_values = st.dictionaries(st.sampled_from([*FIELDS, "before", "junk"]), st.text(max_size=300))


@given(query_values)
def test_any_query_is_a_filter_or_plain_problems(query):
    where, problems = parse_filter(query)
    assert isinstance(where, DeadLetterFilter)
    assert all(isinstance(problem, str) and problem.endswith(".") for problem in problems)
    if not problems:
        assert where.text is None or len(where.text) <= MAX_TEXT
        assert where.since is None or where.since.tzinfo is not None
    before, cursor_problems = parse_before(query)
    assert before is None or before > 0 or cursor_problems == []


@given(query_values)
def test_the_form_values_survive_a_round_trip_through_the_url(query):
    values = form_values(query)
    again = form_values(dict(parse_qsl(query_string(values))))
    assert again == values
    assert parse_filter(values) == parse_filter(again)


def test_a_value_whose_nul_follows_a_space_survives_the_round_trip():
    """Hypothesis found it (helper-23's unit run): a source of `0 \\x00`."""
    values = form_values({"source": "0 \x00"})
    assert form_values(dict(parse_qsl(query_string(values)))) == values


def test_what_a_filter_means():
    where, problems = parse_filter(
        {
            "source": " acme ",
            "status": "all",
            "since": "2026-11-23T10:00",
            "until": "2026-11-23T12:00+01:00",
            "q": "timeout",
            "error_type": "RuntimeError",
        }
    )
    assert problems == []
    assert where == DeadLetterFilter(
        source="acme",
        status=None,
        error_type="RuntimeError",
        since=datetime(2026, 11, 23, 10, tzinfo=UTC),
        until=datetime.fromisoformat("2026-11-23T12:00+01:00"),
        text="timeout",
    )
    assert parse_filter({})[0] == DeadLetterFilter(status="dead")


def test_garbage_is_named_not_applied():
    for query, words in (
        ({"status": "zombie"}, "Status"),
        ({"since": "yesterday"}, "not a date"),
        ({"q": "x" * 5000}, "too long"),
        ({"since": "2026-01-02", "until": "2026-01-01"}, "empty"),
        ({"until": "0001-01-01"}, "out of range"),
    ):
        _, problems = parse_filter(query)
        assert len(problems) == 1 and words in problems[0], query
    assert parse_before({"before": "-3"}) == (None, ["The page link is not valid; showing the newest."])
    assert parse_before({"before": "42"}) == (42, [])
