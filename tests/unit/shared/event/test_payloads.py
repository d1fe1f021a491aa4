"""How a body becomes `event.payload` (docs/reference.md §7): url-encoded forms by Content-Type."""

from urllib.parse import quote, urlencode

import pytest
from hypothesis import given
from hypothesis import strategies as st

from webhook_ingest.shared.event import payloads

texts = st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=16)


@given(pairs=st.lists(st.tuples(texts, texts), max_size=10))
def test_a_form_decodes_to_each_name_once_its_repeats_a_list_in_order(pairs):
    form = payloads.parse_form(urlencode(pairs).encode())
    names = list(dict.fromkeys(name for name, _ in pairs))
    assert list(form) == names
    for name in names:
        values = [value for n, value in pairs if n == name]
        assert form[name] == (values[0] if len(values) == 1 else values)
    assert payloads.values_of(form) == {name: [v for n, v in pairs if n == name] for name in names}


def test_blank_and_bare_fields_are_kept_as_empty_strings():
    assert payloads.parse_form(b"FromCity=&Body=hi+there&flag") == {"FromCity": "", "Body": "hi there", "flag": ""}


@pytest.mark.parametrize("body", [b"a=%FF", b"a=\xff", b"a=%00", b"%00=a"])
def test_a_form_that_is_not_utf8_or_holds_a_nul_is_refused(body):
    with pytest.raises(ValueError):
        payloads.parse_form(body)


@pytest.mark.parametrize(
    "content_type, form",
    [
        ("application/x-www-form-urlencoded", True),
        ("Application/X-WWW-Form-Urlencoded ; charset=UTF-8", True),
        ("application/json", False),
        ("multipart/form-data; boundary=x", False),
        ("", False),
        (None, False),
    ],
)
def test_is_form_reads_the_media_type_only(content_type, form):
    assert payloads.is_form(content_type) is form


@given(value=st.text(max_size=30))
def test_a_percent_encoded_value_decodes_back(value):
    if "\x00" in value or any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        return
    assert payloads.parse_form(f"v={quote(value, safe='')}".encode()) == {"v": value}


@given(fields=st.integers(min_value=1, max_value=3 * payloads.MAX_FORM_FIELDS))
def test_a_form_of_more_fields_than_max_form_fields_is_refused(fields):
    body = "&".join(f"f{n}=" for n in range(fields)).encode()
    if fields <= payloads.MAX_FORM_FIELDS:
        assert len(payloads.parse_form(body)) == fields
    else:
        with pytest.raises(ValueError):
            payloads.parse_form(body)


def test_a_body_that_starts_as_json_is_json_whatever_the_content_type():
    assert payloads.reads_as_json(b' \n{"id": 1}') and not payloads.reads_as_json(b"payload=%7B%7D")
    assert payloads.content_type_read("application/x-www-form-urlencoded", as_form=False) == payloads.JSON
    assert payloads.content_type_read("text/plain", as_form=True) == payloads.FORM
    assert payloads.content_type_read("application/json; charset=utf-8", as_form=False) is None  # as sent


def test_a_value_sent_twice_under_one_name_is_a_repeated_field():
    assert payloads.repeats_a_field({"Body": ["hi", "hi"]})
    assert not payloads.repeats_a_field({"MediaUrl0": ["https://a/1", "https://a/2"], "Body": "hi"})
