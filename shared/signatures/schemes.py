"""The scheme names of the sources file, each with its verifier builder and its signer."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial

from . import body, credentials, slack, square, standard, stripe, twilio
from .contract import SignOptions, SourceOptions, Verifier
from .errors import SchemeConfigError


@dataclass(frozen=True)
class Scheme:
    verifier: Callable[[Sequence[str], SourceOptions], Verifier]
    sign: Callable[[bytes, str, SignOptions], dict[str, str]]
    signature_headers: tuple[str, ...]  # lower-case: hidden from viewers (shared/signature_headers.py)


def _body(name: str) -> Scheme:
    return Scheme(partial(body.verifier, name), partial(body.sign, name), (body.FORMATS[name].header.lower(),))


SCHEME_TABLE: Mapping[str, Scheme] = {
    "stripe": Scheme(stripe.verifier, stripe.sign, ("stripe-signature",)),
    # GitHub's sha1 X-Hub-Signature beside the sha256 one is as good for a replay
    "github": replace(_body("github"), signature_headers=("x-hub-signature-256", "x-hub-signature")),
    "shopify": _body("shopify"),
    "paystack": _body("paystack"),
    "standard-webhooks": Scheme(standard.verifier, standard.sign, ("webhook-signature", "svix-signature")),
    "hmac-sha256": _body("hmac-sha256"),
    "standard-webhooks-v1a": Scheme(
        standard.asymmetric_verifier, standard.asymmetric_sign, ("webhook-signature", "svix-signature")
    ),
    "slack": Scheme(slack.verifier, slack.sign, ("x-slack-signature",)),
    "gitlab": Scheme(credentials.gitlab_verifier, credentials.gitlab_sign, ()),
    "twilio": Scheme(twilio.verifier, twilio.sign, ("x-twilio-signature",)),
    "square": Scheme(square.verifier, square.sign, ("x-square-hmacsha256-signature", "x-square-signature")),
    "basic-auth": Scheme(credentials.basic_auth_verifier, credentials.basic_auth_sign, ()),
    "api-key": Scheme(credentials.api_key_verifier, credentials.api_key_sign, ()),
}
SCHEMES: tuple[str, ...] = tuple(SCHEME_TABLE)
# Every scheme's signature headers: what the archive and the dead letters hide from viewers (a
# source's own hmac-sha256 `signature_header` is added by the reader, `hidden_signatures`).
SIGNATURE_HEADERS = frozenset(name for scheme in SCHEME_TABLE.values() for name in scheme.signature_headers)
# The schemes that sign the URL the provider calls: their sources must state it.
URL_SIGNING_SCHEMES = frozenset({"twilio", "square"})


def build_verifier(
    scheme: str,
    secrets: Sequence[str],
    *,
    tolerance_seconds: float = 300,
    signature_header: str | None = None,
    public_url: str | None = None,
) -> Verifier:
    """The verifier for one source; ValueError (a `SchemeConfigError` naming the field) when unusable."""
    options = SourceOptions(tolerance_seconds, signature_header, public_url)
    if public_url is not None and scheme not in URL_SIGNING_SCHEMES:
        raise SchemeConfigError(
            f"only {' and '.join(sorted(URL_SIGNING_SCHEMES))} sign the URL; the {scheme} scheme does not read it",
            field="public_url",
        )
    return _scheme(scheme).verifier(secrets, options)


def sign(
    scheme: str,
    body: bytes,
    secret: str,
    *,
    timestamp: int | None = None,
    msg_id: str | None = None,
    signature_header: str | None = None,
    public_url: str | None = None,
    query_string: str = "",
    content_type: str | None = None,
) -> dict[str, str]:
    """The headers the provider would send with `body` (for a scheme that signs the URL, to `public_url`
    with `query_string`; for standard-webhooks-v1a, `secret` is the private key)."""
    options = SignOptions(timestamp, msg_id, signature_header, public_url, query_string, content_type)
    return _scheme(scheme).sign(body, secret, options)


def _scheme(scheme: str) -> Scheme:
    if scheme not in SCHEME_TABLE:
        raise SchemeConfigError(f"unknown signature scheme {scheme!r} (known: {', '.join(SCHEMES)})", field="scheme")
    return SCHEME_TABLE[scheme]
