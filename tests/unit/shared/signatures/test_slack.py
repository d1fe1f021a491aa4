"""slack (docs/reference.md §4) against slack_sdk's own SignatureVerifier."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict
from slack_sdk.signature import Clock, SignatureVerifier

from tests.support.signing import PROVIDERS
from webhook_ingest.shared import signatures
from webhook_ingest.shared.signatures import InvalidSignature, MissingSignature, StaleTimestamp, slack

NOW = 1_760_000_000
SECRET = PROVIDERS["slack"].source_secret
OLD_SECRET = PROVIDERS["slack"].old_source_secret


class FixedClock(Clock):
    def __init__(self, now: float):
        self._now = now

    def now(self) -> float:
        return self._now


def verify(headers, body, secrets=(SECRET,), now=NOW):
    signatures.build_verifier("slack", list(secrets)).verify(CIMultiDict(headers), body, now=now)


def sdk_signed(body: bytes, secret: str = SECRET, timestamp: int = NOW) -> dict[str, str]:
    signature = SignatureVerifier(secret).generate_signature(timestamp=str(timestamp), body=body)
    return {"X-Slack-Request-Timestamp": str(timestamp), "X-Slack-Signature": signature}


@given(body=st.text(max_size=1024).map(str.encode))  # slack_sdk decodes the body as UTF-8
def test_we_accept_what_slack_sdk_signs_and_it_accepts_what_we_sign(body):
    verify(sdk_signed(body), body)
    ours = signatures.sign("slack", body, SECRET, timestamp=NOW)
    assert SignatureVerifier(SECRET, FixedClock(NOW)).is_valid_request(body, ours)


@pytest.mark.parametrize("skew", [-301, 301])
def test_outside_five_minutes_is_stale_for_both(skew):
    body = b"token=x&command=%2Fdeploy&trigger_id=13345224609.738474920.8088930838d88f008e0"
    headers = sdk_signed(body, timestamp=NOW + skew)
    assert not SignatureVerifier(SECRET, FixedClock(NOW)).is_valid_request(body, headers)
    with pytest.raises(StaleTimestamp):
        verify(headers, body)


def test_rotation_wrong_secret_and_missing_headers():
    body = b'{"type": "event_callback", "event_id": "Ev1"}'
    for secret in (OLD_SECRET, SECRET):
        verify(sdk_signed(body, secret), body, secrets=[OLD_SECRET, SECRET])
    with pytest.raises(InvalidSignature):
        verify(sdk_signed(body, "not-the-secret"), body)
    with pytest.raises(MissingSignature):
        verify({"X-Slack-Request-Timestamp": str(NOW)}, body)
    with pytest.raises(InvalidSignature):  # no timestamp: nothing to check the signature over
        verify({"X-Slack-Signature": sdk_signed(body)["X-Slack-Signature"]}, body)


@given(value=st.one_of(st.text(max_size=80), st.from_regex(r"v[0-9]=[0-9a-fA-F]{0,70}", fullmatch=True)))
def test_the_signature_header_parses_or_is_invalid(value):
    try:
        parsed = slack.parse_signature(value)
    except InvalidSignature:
        return
    assert value == "v0=" + value[3:] and parsed == bytes.fromhex(value[3:])


@given(digest=st.binary(min_size=32, max_size=32))
def test_a_v0_header_round_trips(digest):
    assert slack.parse_signature("v0=" + digest.hex()) == digest
