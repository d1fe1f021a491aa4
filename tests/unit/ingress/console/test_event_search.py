"""The Events page's search from a query string (ingress/console/event_search.py):
whatever a URL holds, a search and plain-language problems a page can show
— never an exception, never text the page could not encode — and the next
page's query carries the filter."""

from datetime import UTC, datetime
from urllib.parse import parse_qs

from hypothesis import given
from hypothesis import strategies as st

from webhook_ingest.ingress.console.event_search import FIELDS, event_search
from webhook_ingest.shared.archive.search import Cursor


@given(st.dictionaries(st.sampled_from((*FIELDS, "cursor", "other")), st.text(max_size=300)))
def test_any_query_is_a_search_and_what_the_page_shows_can_be_encoded(query):
    search = event_search(query)
    for text in (*search.values.values(), *search.problems, search.cursor_problem or "", search.query()):
        text.encode("utf-8")
    assert set(search.values) == set(FIELDS)
    if search.problems:
        assert all(problem.endswith(".") for problem in search.problems)


def test_each_bad_field_is_named_with_what_was_typed():
    search = event_search({"since": " yesterday ", "payload": "[1]", "source": "stripe"})
    assert search.problems == [
        "From: “yesterday” is not valid — an ISO 8601 time such as 2026-11-25T14:00:00Z.",
        'Payload contains: “[1]” is not valid — a JSON object such as {"customer": "cus_123"}.',
    ]
    assert search.values["source"] == "stripe"


def test_the_next_page_keeps_the_filter_and_a_bad_cursor_is_the_newest_page():
    search = event_search({"source": "stripe", "payload": '{"customer": "cus_123"}', "status": ""})
    assert search.where.source == "stripe" and search.where.status is None and search.after is None
    following = parse_qs(search.query(cursor="abc"))
    assert following == {"source": ["stripe"], "payload": ['{"customer": "cus_123"}'], "cursor": ["abc"]}
    assert event_search({"cursor": "garbage"}).cursor_problem is not None
    assert event_search({"cursor": "garbage"}).after is None
    cursor = Cursor(datetime(2026, 11, 25, tzinfo=UTC), "stripe", "stripe:evt_1")
    assert event_search({"cursor": cursor.encode()}).after == cursor
