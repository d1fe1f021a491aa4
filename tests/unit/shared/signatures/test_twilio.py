"""twilio (docs/reference.md §4) against twilio's own `RequestValidator`: forms, JSON with
bodySHA256, the port, HMAC-SHA256 shared keys."""

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict, MultiDict
from twilio.request_validator import RequestValidator

from tests.support.signing import PROVIDERS, TWILIO_URL
from webhook_ingest.shared import signatures
from webhook_ingest.shared.signatures import InvalidSignature, MissingSignature, SchemeConfigError, twilio

TOKEN = PROVIDERS["twilio"].source_secret
OLD_TOKEN = PROVIDERS["twilio"].old_source_secret
FORM = "application/x-www-form-urlencoded"


def verify(headers, body, query_string="", secrets=(TOKEN,), url=TWILIO_URL):
    verifier = signatures.build_verifier("twilio", list(secrets), public_url=url)
    return verifier.verify(CIMultiDict(headers), body, query_string=query_string)


def form_headers(signature: str, **more: str) -> dict[str, str]:
    return {"X-Twilio-Signature": signature, "Content-Type": f"{FORM}; charset=utf-8", **more}


field_names = st.text(
    alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), min_size=1, max_size=12
)
field_values = st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=20)
forms = st.lists(st.tuples(field_names, field_values), max_size=8)


def encoded(pairs) -> bytes:
    from urllib.parse import urlencode

    return urlencode(pairs).encode()


@given(pairs=forms)
def test_we_accept_a_form_the_validator_signs_repeated_fields_included(pairs):
    signature = RequestValidator(TOKEN).compute_signature(TWILIO_URL, MultiDict(pairs))
    form = verify(form_headers(signature), encoded(pairs)).form
    assert form is not None and twilio.signed_fields(form) == twilio.signed_fields(
        {name: [value for n, value in pairs if n == name] for name, _ in pairs}
    )


@given(pairs=forms)
def test_the_validator_accepts_a_form_we_sign(pairs):
    headers = signatures.sign("twilio", encoded(pairs), TOKEN, public_url=TWILIO_URL, content_type=FORM)
    assert RequestValidator(TOKEN).validate(TWILIO_URL, MultiDict(pairs), headers["X-Twilio-Signature"])


@given(body=st.text(max_size=512))
def test_json_is_covered_by_body_sha256_in_the_url(body):
    query = twilio.body_hash_query(body.encode())
    signature = RequestValidator(TOKEN).compute_signature(f"{TWILIO_URL}?{query}", {})
    assert RequestValidator(TOKEN).validate(f"{TWILIO_URL}?{query}", body, signature)
    verified = verify({"X-Twilio-Signature": signature, "Content-Type": FORM}, body.encode(), query)  # the query says
    assert verified.json and verified.form is None
    with pytest.raises(InvalidSignature, match="does not match"):
        verify({"X-Twilio-Signature": signature}, body.encode() + b" ", query)


def test_a_body_that_is_not_a_form_without_body_sha256_is_refused():
    # The validator accepts it (params a string, no bodySHA256: the URL alone), but then nothing covers the body:
    # without bodySHA256 the body is a form, whose one field the signature does not cover.
    signature = RequestValidator(TOKEN).compute_signature(TWILIO_URL, {})
    with pytest.raises(InvalidSignature, match="no signature matches"):
        verify({"X-Twilio-Signature": signature, "Content-Type": "application/json"}, b'{"any": "thing"}')


@pytest.mark.parametrize("signed_url", [TWILIO_URL, "https://hooks.example.com:443/webhooks/twilio"])
def test_the_url_is_tried_with_and_without_its_default_port(signed_url):
    signature = RequestValidator(TOKEN).compute_signature(signed_url, {"Body": "hi"})
    verify(form_headers(signature), b"Body=hi")
    verify(form_headers(signature), b"Body=hi", url="https://hooks.example.com:443/webhooks/twilio")


def test_the_query_string_is_signed_as_received():
    signature = RequestValidator(TOKEN).compute_signature(f"{TWILIO_URL}?tenant=7", {"Body": "hi"})
    verify(form_headers(signature), b"Body=hi", "tenant=7")
    with pytest.raises(InvalidSignature):
        verify(form_headers(signature), b"Body=hi", "tenant=8")


def test_a_shared_key_signs_with_hmac_sha256_when_the_request_says_so():
    signature = RequestValidator(TOKEN).compute_signature(TWILIO_URL, {"Body": "hi"}, "HMAC_SHA256")
    settings = {"X-Twilio-Webhooks-Signature-Settings": "key=webhooks_sharedkey_1,algorithm=HMAC_SHA256"}
    verify(form_headers(signature, **settings), b"Body=hi")
    with pytest.raises(InvalidSignature):
        verify(form_headers(signature), b"Body=hi")  # read as HMAC-SHA1
    with pytest.raises(InvalidSignature, match="unknown"):
        verify(form_headers(signature, **{"X-Twilio-Webhooks-Signature-Settings": "algorithm=HMAC_MD5"}), b"Body=hi")


def test_rotation_wrong_token_and_missing_header():
    for token in (OLD_TOKEN, TOKEN):
        signature = RequestValidator(token).compute_signature(TWILIO_URL, {"Body": "hi"})
        verify(form_headers(signature), b"Body=hi", secrets=[OLD_TOKEN, TOKEN])
    with pytest.raises(InvalidSignature):
        verify(form_headers(RequestValidator("nope").compute_signature(TWILIO_URL, {"Body": "hi"})), b"Body=hi")
    with pytest.raises(MissingSignature):
        verify({"Content-Type": FORM}, b"Body=hi")


@given(settings=st.text(max_size=60))
def test_the_settings_header_names_an_algorithm_or_is_invalid(settings):
    try:
        assert twilio.algorithm(settings) in twilio.ALGORITHMS
    except InvalidSignature:
        assert "algorithm" in settings


@pytest.mark.parametrize(
    "url, problem",
    [
        (None, "set public_url"),
        ("https://hooks.example.com/webhooks/twilio?tenant=7", "query"),
        ("https://hooks.example.com/webhooks/twilio#rc=3", "fragment"),
        ("/webhooks/twilio", "absolute"),
    ],
)
def test_a_twilio_source_states_its_public_url_without_query(url, problem):
    with pytest.raises(SchemeConfigError, match=problem) as raised:
        signatures.build_verifier("twilio", [TOKEN], public_url=url)
    assert raised.value.field == "public_url"


def test_body_hash_query_is_the_hex_sha256():
    assert twilio.body_hash_query(b"{}") == "bodySHA256=" + hashlib.sha256(b"{}").hexdigest()
