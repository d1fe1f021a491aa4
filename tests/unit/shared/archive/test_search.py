"""The event archive's search filter from a query string
(shared/archive/search.py), shared by the admin API, the CLI and the
console: whatever the input, a filter Postgres can run and a list of what
was wrong, never an exception and never a value Postgres would refuse."""

import json

from hypothesis import given
from hypothesis import strategies as st

from webhook_ingest.shared.archive.search import FIELDS, InvalidFilter, filter_and_problems, parse_filter

NAMES = ("source", "status", "type", "since", "until", "key", "event_id", "payload")


def storable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return "\x00" not in text


@given(st.dictionaries(st.sampled_from(NAMES), st.text()))
def test_any_query_is_a_filter_postgres_can_run_or_a_problem(query):
    where, problems = filter_and_problems(query)
    for value in (where.source, where.event_type, where.key, where.event_id, where.payload):
        assert value is None or storable(value)
    if where.payload is not None:
        assert isinstance(json.loads(where.payload), dict)
        assert "\\u0000" not in where.payload
    assert [problem.field for problem in problems] == sorted((p.field for p in problems), key=FIELDS.index)
    assert all(isinstance(problem, InvalidFilter) for problem in problems)


def test_every_bad_field_is_told_and_left_out():
    where, problems = filter_and_problems(
        {
            "status": "zombie",
            "since": "yesterday",
            "source": "stripe",
            "payload": '{"a": NaN}',
            "key": "a\x00b",
            "type": "\ud800",
        }
    )
    assert [problem.field for problem in problems] == ["status", "since", "payload", "type", "key"]
    assert where.source == "stripe" and (where.status, where.since, where.payload, where.key) == (None,) * 4


def test_parse_filter_raises_the_first_problem_as_the_admin_api_answers_it():
    try:
        parse_filter({"payload": "[]", "until": "soon"})
    except InvalidFilter as exc:
        assert exc.field == "until"
    else:
        raise AssertionError("no InvalidFilter")


def test_payloads_postgres_would_refuse_are_problems():
    for text in ('{"a": "\\u0000"}', '{"\\ud800": 1}', '{"a": Infinity}', "[" * 5000, '"text"'):
        assert [p.field for p in filter_and_problems({"payload": text})[1]] == ["payload"], text
    assert filter_and_problems({"payload": '{"customer": "cus_123", "n": 123456789012345678901234}'})[1] == []


def test_stale_is_an_archive_status_a_search_may_ask_for():
    where, problems = filter_and_problems({"status": "stale"})
    assert problems == [] and where.status == "stale"
