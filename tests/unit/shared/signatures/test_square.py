"""square (docs/reference.md §4) against the squareup SDK's own `verify_signature` and its published vectors."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict
from square.utils.webhooks_helper import verify_signature

from tests.support.signing import PROVIDERS, SQUARE_URL
from webhook_ingest.shared import signatures
from webhook_ingest.shared.signatures import InvalidSignature, MissingSignature, SchemeConfigError

HEADER = "x-square-hmacsha256-signature"
KEY = PROVIDERS["square"].source_secret
OLD_KEY = PROVIDERS["square"].old_source_secret

# The squareup SDK's tests (tests/integration/test_webhooks_helper.py in square-python-sdk).
SDK_BODY = (
    b'{"merchant_id":"MLEFBHHSJGVHD","type":"webhooks.test_notification","event_id":"ac3ac95b-f97d-458c-a6e6-'
    b'18981597e05f","created_at":"2022-07-13T20:30:59.037339943Z","data":{"type":"webhooks","id":"bc368e64-01aa-'
    b'407e-b46e-3231809b1129"}}'
)
SDK_SIGNATURE = "GF4YkrJgGBDZ9NIYbNXBnMzqb2HoL4RW/S6vkZ9/2N4="
SDK_KEY = "Ibxx_5AKakO-3qeNVR61Dw"
SDK_URL = "https://webhook.site/679a4f3a-dcfa-49ee-bac5-9d0edad886b9"


def verify(headers, body, secrets=(KEY,), url=SQUARE_URL):
    signatures.build_verifier("square", list(secrets), public_url=url).verify(CIMultiDict(headers), body)


def test_the_sdks_published_vectors():
    verify({HEADER: SDK_SIGNATURE}, SDK_BODY, secrets=[SDK_KEY], url=SDK_URL)
    verify(
        {HEADER: "Cxt7+aTi4rKgcA0bC4g9EHdVtLSDWdqccmL5MvihU4U="},
        b'{"data":{"type":"webhooks","id":">id<"}}',
        secrets=["signature-key"],
        url="https://webhook.site/webhooks",
    )
    with pytest.raises(InvalidSignature):  # the SDK's url-mismatch case
        verify(
            {HEADER: SDK_SIGNATURE},
            SDK_BODY,
            secrets=[SDK_KEY],
            url="https://webhook.site/79a4f3a-dcfa-49ee-bac5-9d0edad886b9",
        )


@given(body=st.text(min_size=1, max_size=512))
def test_the_sdk_accepts_what_we_sign(body):
    headers = signatures.sign("square", body.encode(), KEY, public_url=SQUARE_URL)
    assert verify_signature(
        request_body=body, signature_header=headers[HEADER], signature_key=KEY, notification_url=SQUARE_URL
    )
    verify(headers, body.encode())


def test_rotation_wrong_key_and_missing_header():
    body = b'{"event_id": "e1"}'
    for key in (OLD_KEY, KEY):
        verify(signatures.sign("square", body, key, public_url=SQUARE_URL), body, secrets=[OLD_KEY, KEY])
    with pytest.raises(InvalidSignature):
        verify(signatures.sign("square", body, "not-the-key", public_url=SQUARE_URL), body)
    with pytest.raises(InvalidSignature):  # signed for another URL
        verify(signatures.sign("square", body, KEY, public_url="https://hooks.example.com/webhooks/square"), body)
    with pytest.raises(MissingSignature):
        verify({}, body)


@pytest.mark.parametrize(
    "url, problem",
    [
        (None, "set public_url"),
        ("hooks.example.com/webhooks/square", "absolute http"),
        ("ftp://hooks.example.com/x", "absolute http"),
        ("https://hooks.example.com/x#part", "fragment"),
        ("https://hooks.example.com:port/x", "not a URL"),
    ],
)
def test_an_unusable_public_url_stops_the_start(url, problem):
    with pytest.raises(SchemeConfigError, match=problem) as raised:
        signatures.build_verifier("square", [KEY], public_url=url)
    assert raised.value.field == "public_url"
