"""The fingerprint that groups failures into incidents (shared/incidents/model.py)."""

import re

from hypothesis import given
from hypothesis import strategies as st

from webhook_ingest.shared.incidents.model import PATTERN_CHARS, Fingerprint, mask

words = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)


@given(st.text(max_size=800))
def test_masking_is_idempotent_bounded_and_leaves_no_digit(message):
    masked = mask(message)
    assert mask(masked) == masked
    assert len(masked) <= PATTERN_CHARS
    assert not re.search(r"\d", masked)


@given(
    st.lists(st.integers(min_value=0), min_size=3, max_size=3),
    st.lists(st.integers(min_value=0), min_size=3, max_size=3),
    st.uuids(),
    st.uuids(),
)
def test_one_outage_is_one_fingerprint_whatever_ids_and_numbers_it_names(first, second, uuid_a, uuid_b):
    def message(numbers, uuid):
        order, seconds, status = numbers
        return (
            f"POST https://crm.example/v1/orders/{order}?try={seconds} for evt_{order}x{status} "
            f"({uuid}, ops+{status}@example.com) timed out after {seconds}.5 s with {status}"
        )

    assert Fingerprint.of("ReadTimeout", message(first, uuid_a)) == Fingerprint.of(
        "ReadTimeout", message(second, uuid_b)
    )


@given(words, words)
def test_the_error_type_and_the_words_tell_incidents_apart(message, other_type):
    assert Fingerprint.of("ValueError", message).digest != Fingerprint.of("ValueError!" + other_type, message).digest


def test_what_a_masked_message_looks_like():
    masked = mask(
        "ConnectionError: POST https://crm.example/v1/orders/8812 timed out after 30 s "
        "(request 7f3a9c2e11d0, customer cus_Q2x81Kd, 550e8400-e29b-41d4-a716-446655440000)"
    )
    assert masked == "ConnectionError: POST <url> timed out after <n> s (request <hex>, customer <id>, <uuid>)"
    assert (
        Fingerprint.of("HTTPError", "500 Server Error").digest == Fingerprint.of("HTTPError", "502 Server Error").digest
    )
