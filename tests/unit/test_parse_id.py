"""shared/dead_letters/model.parse_id: any user text is an id or None, never an
error (issue 21, item 7: a 5,000-digit id or `limit` was a 500 — Python's
int() refuses more than 4,300 digits)."""

from hypothesis import given
from hypothesis import strategies as st

from webhook_ingest.shared.dead_letters.model import MAX_ID, parse_id


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
