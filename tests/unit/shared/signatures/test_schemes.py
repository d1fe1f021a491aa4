"""The signature schemes of docs/reference.md §4, all of them against our signer; the first six
against the providers' own libraries (`standardwebhooks`, the Stripe SDK) and published vectors.
The later ones' providers are in tests/unit/shared/signatures/test_*.py."""

import base64
import hashlib
import hmac
import time

import pytest
import standardwebhooks
import stripe
from hypothesis import given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from tests.support.signing import PROVIDER_SECRETS, PROVIDERS
from webhook_ingest.shared import signatures
from webhook_ingest.shared.signatures import InvalidSignature, MissingSignature, SignatureError, StaleTimestamp, twilio

NOW = 1_760_000_000
SECRETS = PROVIDER_SECRETS
TIMED = ("stripe", "standard-webhooks", "standard-webhooks-v1a", "slack")
bodies = st.binary(max_size=2048)
schemes = st.sampled_from(signatures.SCHEMES)
CREDENTIALS = ("gitlab", "basic-auth", "api-key")  # a secret sent as it is: nothing binds it to the body


def verify(scheme, headers, body, secrets=None, now=NOW, **kwargs):
    options = {**PROVIDERS[scheme].options, **kwargs}
    verifier = signatures.build_verifier(scheme, secrets or [PROVIDERS[scheme].source_secret], **options)
    verifier.verify(CIMultiDict(headers), body, now=now, query_string=query_for(scheme, body))


def sign(scheme, body, secret=None, timestamp=NOW, **kwargs):
    options = {**PROVIDERS[scheme].options, **kwargs}
    return signatures.sign(
        scheme,
        body,
        secret or PROVIDERS[scheme].signer,
        timestamp=timestamp,
        query_string=query_for(scheme, body),
        **options,
    )


def query_for(scheme, body):
    """Twilio covers a body that is not a form through the URL's bodySHA256."""
    return twilio.body_hash_query(body) if scheme == "twilio" else ""


@given(scheme=schemes, body=bodies)
def test_what_we_sign_verifies(scheme, body):
    verify(scheme, sign(scheme, body), body)


@given(
    scheme=st.sampled_from([s for s in signatures.SCHEMES if s not in CREDENTIALS]),
    body=bodies,
    flip=st.integers(min_value=0),
)
def test_any_changed_byte_is_an_invalid_signature(scheme, body, flip):
    headers = sign(scheme, body)
    tampered = body + b"x" if not body else _flip_byte(body, flip % len(body))
    with pytest.raises(InvalidSignature):
        verify(scheme, headers, tampered)


def _flip_byte(body: bytes, index: int) -> bytes:
    return body[:index] + bytes([body[index] ^ 0x01]) + body[index + 1 :]


@pytest.mark.parametrize("scheme", signatures.SCHEMES)
def test_wrong_secret_is_invalid(scheme):
    body = b'{"id": "evt_1"}'
    with pytest.raises(InvalidSignature):
        verify(scheme, sign(scheme, body, secret=PROVIDERS[scheme].old_signer), body)


@pytest.mark.parametrize("scheme", signatures.SCHEMES)
def test_rotation_accepts_every_listed_secret(scheme):
    body = b'{"id": "evt_1"}'
    provider = PROVIDERS[scheme]
    for signer in (provider.old_signer, provider.signer):
        verify(
            scheme,
            sign(scheme, body, secret=signer),
            body,
            secrets=[provider.old_source_secret, provider.source_secret],
        )


@pytest.mark.parametrize("scheme", signatures.SCHEMES)
def test_absent_header_is_missing_signature(scheme):
    with pytest.raises(MissingSignature) as raised:
        verify(scheme, {"Content-Type": "application/json"}, b"{}")
    assert raised.value.code == "missing_signature"


@pytest.mark.parametrize("scheme", TIMED)
@pytest.mark.parametrize("skew", [-301, 301, -(10**9)])
def test_a_valid_signature_outside_the_tolerance_is_stale(scheme, skew):
    body = b'{"id": "evt_1"}'
    with pytest.raises(StaleTimestamp) as raised:
        verify(scheme, sign(scheme, body, timestamp=NOW + skew), body)
    assert raised.value.code == "stale_timestamp"
    verify(scheme, sign(scheme, body, timestamp=NOW + skew), body, now=NOW + skew)


@pytest.mark.parametrize("scheme", TIMED)
def test_a_forged_old_timestamp_is_invalid_not_stale(scheme):
    body = b'{"id": "evt_1"}'
    with pytest.raises(InvalidSignature):
        verify(scheme, sign(scheme, body, secret=PROVIDERS[scheme].old_signer, timestamp=NOW - 3600), body)


def test_tolerance_is_configurable():
    body = b"{}"
    verify("stripe", sign("stripe", body, timestamp=NOW - 1000), body, tolerance_seconds=1200)


header_names = st.sampled_from(
    [
        "Stripe-Signature",
        "X-Hub-Signature-256",
        "X-Shopify-Hmac-Sha256",
        "X-Paystack-Signature",
        "X-Signature",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "svix-id",
        "svix-timestamp",
        "svix-signature",
        "X-Slack-Signature",
        "X-Slack-Request-Timestamp",
        "X-Gitlab-Token",
        "X-Twilio-Signature",
        "X-Twilio-Webhooks-Signature-Settings",
        "x-square-hmacsha256-signature",
        "Authorization",
        "X-API-Key",
        "Content-Type",
    ]
)
header_values = st.one_of(
    st.text(max_size=200),
    st.from_regex(r"t=\d{0,20},v1=[0-9a-f]{0,70}(,v0=\w*)?", fullmatch=True),
    st.from_regex(r"(v\d,[A-Za-z0-9+/=]{0,50} ?){0,3}", fullmatch=True),
    st.from_regex(r"sha256=[0-9a-fA-F]{0,70}", fullmatch=True),
    st.from_regex(r"v0=[0-9a-f]{0,70}", fullmatch=True),
    st.from_regex(r"(v1a,[A-Za-z0-9+/]{86}== ?){0,9}", fullmatch=True),
    st.from_regex(r"(Basic|basic|Bearer) [A-Za-z0-9+/=:]{0,40}", fullmatch=True),
    st.from_regex(r"(key=\w*,)?algorithm=(HMAC_SHA1|HMAC_SHA256|hmac_sha512|)", fullmatch=True),
    st.sampled_from(["application/x-www-form-urlencoded", "application/json; charset=utf-8"]),
)


@settings(max_examples=300)
@given(scheme=schemes, headers=st.dictionaries(header_names, header_values, max_size=4), body=bodies)
def test_garbage_headers_are_only_ever_a_signature_error(scheme, headers, body):
    # The ingress turns a SignatureError into 401; anything else would be a 500.
    with pytest.raises(SignatureError):
        verify(scheme, headers, body)


# --- against the providers' own code --------------------------------------

utf8_bodies = st.text(max_size=1024).map(str.encode)


@given(body=utf8_bodies)
def test_standard_webhooks_library_accepts_what_we_sign(body):
    secret = SECRETS["standard-webhooks"]
    headers = signatures.sign("standard-webhooks", body, secret, msg_id="msg_2Lh9KRb0pzN4LePd3XiA4")
    standardwebhooks.Webhook(secret).verify(body, headers, json_parse=False)


@pytest.mark.parametrize("prefix", ["webhook-", "svix-"])
@given(body=utf8_bodies)
def test_we_accept_what_the_standard_webhooks_library_signs(prefix, body):
    secret = SECRETS["standard-webhooks"]
    timestamp = int(time.time())
    signature = standardwebhooks.Webhook(secret).sign("msg_1", _utc(timestamp), body.decode())
    headers = {f"{prefix}id": "msg_1", f"{prefix}timestamp": str(timestamp), f"{prefix}signature": signature}
    verify("standard-webhooks", headers, body, now=timestamp)


def _utc(timestamp):
    from datetime import UTC, datetime

    return datetime.fromtimestamp(timestamp, tz=UTC)


@given(body=utf8_bodies)
def test_stripe_sdk_accepts_what_we_sign(body):
    header = sign("stripe", body, timestamp=int(time.time()))["Stripe-Signature"]
    assert stripe.WebhookSignature.verify_header(body.decode(), header, SECRETS["stripe"], tolerance=300)


@given(body=utf8_bodies)
def test_we_accept_what_the_stripe_sdk_signs(body):
    header = stripe.WebhookSignature.generate_signature_header(body.decode(), SECRETS["stripe"], timestamp=NOW)
    verify("stripe", {"Stripe-Signature": header}, body)


def test_stripe_ignores_v0_and_accepts_any_of_several_v1():
    body = b'{"id": "evt_1"}'
    good = sign("stripe", body)["Stripe-Signature"].split("v1=")[1]
    header = f"t={NOW},v0={'0' * 64},v1={'1' * 64},v1={good}"
    verify("stripe", {"Stripe-Signature": header}, body)


def test_github_published_example():
    # https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries
    body = b"Hello, World!"
    expected = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    assert sign("github", body, secret="It's a Secret to Everybody") == {"X-Hub-Signature-256": expected}
    verify("github", {"X-Hub-Signature-256": expected}, body, secrets=["It's a Secret to Everybody"])


def test_shopify_and_paystack_match_their_documented_recipes():
    body = b'{"id": 1}'
    shopify = base64.b64encode(hmac.new(b"shopify-secret", body, hashlib.sha256).digest()).decode()
    paystack = hmac.new(b"sk_test_paystack", body, hashlib.sha512).hexdigest()
    assert sign("shopify", body) == {"X-Shopify-Hmac-Sha256": shopify}
    assert sign("paystack", body) == {"X-Paystack-Signature": paystack}


def test_hmac_sha256_header_name_is_per_source():
    body = b"{}"
    headers = signatures.sign("hmac-sha256", body, "s", signature_header="X-Acme-Signature")
    assert set(headers) == {"X-Acme-Signature"}
    verify("hmac-sha256", headers, body, secrets=["s"], signature_header="X-Acme-Signature")


@pytest.mark.parametrize(
    "scheme, secrets, problem",
    [
        ("sha1", ["s"], "unknown signature scheme"),
        ("github", [], "at least one secret"),
        ("github", [""], "empty"),
        ("standard-webhooks", ["whsec_"], "no key bytes"),
        ("standard-webhooks-v1a", ["whsec_" + "A" * 32], "use scheme standard-webhooks"),
        ("standard-webhooks-v1a", [PROVIDERS["standard-webhooks-v1a"].signing_secret], "the private key"),
        ("standard-webhooks-v1a", ["whpk_" + "A" * 40], "32 bytes"),
        ("basic-auth", ["no-colon"], "'username:password'"),
        ("api-key", ["k"], "signature_header"),
        ("twilio", ["t"], "public_url"),
        ("square", ["t"], "public_url"),
    ],
)
def test_unusable_configuration_is_a_value_error(scheme, secrets, problem):
    with pytest.raises(ValueError, match=problem):
        signatures.build_verifier(scheme, secrets)
