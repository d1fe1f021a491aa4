"""Schemes where the provider sends a secret itself, not a signature: gitlab, basic-auth, api-key.

Nothing ties such a credential to the body or to a moment, so anyone who
sees one request (a log, a proxy) can send others: prefer a signing scheme
where the provider offers one. The credential header is never handed on to
handlers or stored (`credential_header`; `Authorization` is dropped anyway).
"""

import base64
from collections.abc import Mapping, Sequence

from . import parts
from .contract import BODY_ONLY, SignOptions, SourceOptions, Verified
from .errors import InvalidSignature, SchemeConfigError

GITLAB_HEADER = "X-Gitlab-Token"
AUTHORIZATION = "Authorization"
BASIC_CHALLENGE = 'Basic realm="webhook-ingest", charset="UTF-8"'


class HeaderCredentialVerifier:
    """gitlab (`X-Gitlab-Token`) and api-key (the source's `signature_header`): the header's value is a secret."""

    def __init__(self, header: str, secrets: Sequence[bytes]):
        self.credential_header = header
        self._credentials = parts.Credentials(secrets)

    def verify(
        self, headers: Mapping[str, str], body: bytes, now: float | None = None, *, query_string: str = ""
    ) -> Verified:
        self._credentials.require(parts.utf8(parts.header(headers, self.credential_header)))
        return BODY_ONLY  # nothing is signed: whoever holds the credential may send any body


class BasicAuthVerifier:
    """`Authorization: Basic base64(username:password)`, against `username:password` secrets."""

    credential_header = AUTHORIZATION
    challenge = BASIC_CHALLENGE  # the 401's WWW-Authenticate: some clients send credentials only when asked

    def __init__(self, secrets: Sequence[bytes]):
        self._credentials = parts.Credentials(secrets)

    def verify(
        self, headers: Mapping[str, str], body: bytes, now: float | None = None, *, query_string: str = ""
    ) -> Verified:
        self._credentials.require(parse_basic(parts.header(headers, AUTHORIZATION)))
        return BODY_ONLY


def parse_basic(value: str) -> bytes:
    """The `username:password` bytes of an `Authorization: Basic …` value (RFC 7617)."""
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "basic":
        raise InvalidSignature("Authorization is not Basic")
    token = token.strip()
    try:
        credentials = base64.b64decode(token, validate=True)
    except ValueError:
        raise InvalidSignature("the Basic credentials are not base64") from None
    # Pad bits that are not zero ("001=" decodes as "000=" does): no client
    # writes them, and one credential should have one spelling (RFC 4648, section 3.5).
    if base64.b64encode(credentials).decode().rstrip("=") != token.rstrip("="):
        raise InvalidSignature("the Basic credentials are not canonical base64")
    return credentials


def gitlab_verifier(secrets: Sequence[str], options: SourceOptions) -> HeaderCredentialVerifier:
    return HeaderCredentialVerifier(GITLAB_HEADER, _keys(secrets))


def api_key_verifier(secrets: Sequence[str], options: SourceOptions) -> HeaderCredentialVerifier:
    if not options.signature_header:
        raise SchemeConfigError(
            'the api-key scheme needs the header that carries the key, such as signature_header = "X-API-Key"',
            field="signature_header",
        )
    if options.signature_header.lower() == AUTHORIZATION.lower():
        raise SchemeConfigError(
            "for a key in Authorization use scheme basic-auth, or a header of its own", field="signature_header"
        )
    return HeaderCredentialVerifier(options.signature_header, _keys(secrets))


def basic_auth_verifier(secrets: Sequence[str], options: SourceOptions) -> BasicAuthVerifier:
    for label, secret in parts.labelled(secrets):
        if ":" not in secret:
            raise SchemeConfigError(f"{label}: a basic-auth secret is 'username:password'")
    return BasicAuthVerifier(_keys(secrets))


def gitlab_sign(body: bytes, secret: str, options: SignOptions) -> dict[str, str]:
    return {GITLAB_HEADER: secret}


def api_key_sign(body: bytes, secret: str, options: SignOptions) -> dict[str, str]:
    if not options.signature_header:
        raise SchemeConfigError("the api-key scheme needs signature_header", field="signature_header")
    return {options.signature_header: secret}


def basic_auth_sign(body: bytes, secret: str, options: SignOptions) -> dict[str, str]:
    return {AUTHORIZATION: "Basic " + base64.b64encode(parts.utf8_key(secret, "secret")).decode("ascii")}


def _keys(secrets: Sequence[str]) -> list[bytes]:
    return [parts.utf8_key(secret, label) for label, secret in parts.labelled(secrets)]
