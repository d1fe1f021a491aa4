"""gitlab, basic-auth and api-key (docs/reference.md §4): a secret sent as it is, compared in constant time."""

import base64

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from multidict import CIMultiDict

from webhook_ingest.shared import signatures
from webhook_ingest.shared.signatures import InvalidSignature, MissingSignature, SchemeConfigError, credentials


def verify(scheme, headers, secrets, **options):
    signatures.build_verifier(scheme, secrets, **options).verify(CIMultiDict(headers), b"{}")


def test_gitlab_compares_the_token_header_with_each_secret():
    verify("gitlab", {"X-Gitlab-Token": "new"}, ["old", "new"])
    verify("gitlab", {"x-gitlab-token": "old"}, ["old", "new"])  # header names ignore case
    for wrong in ("ne", "new ", "NEW", ""):
        with pytest.raises(InvalidSignature):
            verify("gitlab", {"X-Gitlab-Token": wrong}, ["old", "new"])
    with pytest.raises(MissingSignature):
        verify("gitlab", {"X-Gitlab-Event": "Push Hook"}, ["new"])


def test_basic_auth_takes_rfc_7617s_example():
    # RFC 7617, section 2: Aladdin / open sesame.
    verify("basic-auth", {"Authorization": "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="}, ["Aladdin:open sesame"])
    verify("basic-auth", {"Authorization": "basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="}, ["x:y", "Aladdin:open sesame"])
    assert signatures.sign("basic-auth", b"", "Aladdin:open sesame") == {
        "Authorization": "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ=="
    }


@pytest.mark.parametrize(
    "value",
    [
        "Bearer QWxhZGRpbjpvcGVuIHNlc2FtZQ==",
        "Basic QWxhZGRpbjpvcGVuIHNlc2FtZQ",
        "Basic " + base64.b64encode(b"Aladdin:open sesamE").decode(),
        "Basic",
        "",
    ],
)
def test_basic_auth_refuses_anything_else(value):
    with pytest.raises(InvalidSignature):
        verify("basic-auth", {"Authorization": value}, ["Aladdin:open sesame"])


def test_basic_auth_without_a_header_is_missing_and_asks_for_credentials():
    verifier = signatures.build_verifier("basic-auth", ["u:p"])
    with pytest.raises(MissingSignature):
        verifier.verify(CIMultiDict(), b"{}")
    assert verifier.challenge.startswith("Basic realm=")  # type: ignore[attr-defined]


def test_api_key_reads_the_sources_header():
    verify("api-key", {"X-API-Key": "k2"}, ["k1", "k2"], signature_header="X-API-Key")
    with pytest.raises(InvalidSignature):
        verify("api-key", {"X-API-Key": "k3"}, ["k1", "k2"], signature_header="X-API-Key")
    with pytest.raises(MissingSignature):
        verify("api-key", {"X-Signature": "k2"}, ["k1", "k2"], signature_header="X-API-Key")


@pytest.mark.parametrize(
    "scheme, options, field",
    [
        ("api-key", {}, "signature_header"),
        ("api-key", {"signature_header": "authorization"}, "signature_header"),
        ("basic-auth", {}, "secrets"),
        ("gitlab", {"public_url": "https://x/webhooks/gitlab"}, "public_url"),
    ],
)
def test_misconfiguration_names_the_field(scheme, options, field):
    with pytest.raises(SchemeConfigError) as raised:
        signatures.build_verifier(scheme, ["no-colon"], **options)
    assert raised.value.field == field


def test_each_verifier_names_its_credential_header():
    assert signatures.build_verifier("gitlab", ["t"]).credential_header == "X-Gitlab-Token"  # type: ignore[attr-defined]
    assert signatures.build_verifier("api-key", ["t"], signature_header="X-Key").credential_header == "X-Key"  # type: ignore[attr-defined]
    assert signatures.build_verifier("basic-auth", ["u:p"]).credential_header == "Authorization"  # type: ignore[attr-defined]


@given(user=st.text(max_size=20).filter(lambda u: ":" not in u), password=st.text(max_size=40))
def test_any_username_and_password_round_trip(user, password):
    secret = f"{user}:{password}"
    verify("basic-auth", signatures.sign("basic-auth", b"", secret), [secret])


@given(value=st.one_of(st.text(max_size=80), st.from_regex(r"(?i:basic) +[A-Za-z0-9+/=]{0,40} *", fullmatch=True)))
@example(value="BASIC 001=")  # non-zero pad bits: found by Hypothesis
def test_an_authorization_value_parses_or_is_invalid(value):
    try:
        parsed = credentials.parse_basic(value)
    except InvalidSignature:
        return
    token = value.strip().partition(" ")[2].strip()
    assert base64.b64encode(parsed).decode().rstrip("=") == token.rstrip("=")  # Python allows excess padding
