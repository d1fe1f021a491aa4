"""The scheme names of the sources file, each with its verifier builder and its signer."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from webhook_ingest.shared.signatures import body, credentials, slack, square, standard, stripe, twilio
from webhook_ingest.shared.signatures.contract import SignOptions, SourceOptions, Verifier
from webhook_ingest.shared.signatures.errors import SchemeConfigError


@dataclass(frozen=True)
class Scheme:
    verifier: Callable[[Sequence[str], SourceOptions], Verifier]
    sign: Callable[[bytes, str, SignOptions], dict[str, str]]


SCHEME_TABLE: Mapping[str, Scheme] = {
    "stripe": Scheme(stripe.verifier, stripe.sign),
    **{name: Scheme(partial(body.verifier, name), partial(body.sign, name))
       for name in ("github", "shopify", "paystack")},
    "standard-webhooks": Scheme(standard.verifier, standard.sign),
    "hmac-sha256": Scheme(partial(body.verifier, "hmac-sha256"), partial(body.sign, "hmac-sha256")),
    "standard-webhooks-v1a": Scheme(standard.asymmetric_verifier, standard.asymmetric_sign),
    "slack": Scheme(slack.verifier, slack.sign),
    "gitlab": Scheme(credentials.gitlab_verifier, credentials.gitlab_sign),
    "twilio": Scheme(twilio.verifier, twilio.sign),
    "square": Scheme(square.verifier, square.sign),
    "basic-auth": Scheme(credentials.basic_auth_verifier, credentials.basic_auth_sign),
    "api-key": Scheme(credentials.api_key_verifier, credentials.api_key_sign),
}
SCHEMES: tuple[str, ...] = tuple(SCHEME_TABLE)
# The schemes that sign the URL the provider calls: their sources must state it.
URL_SIGNING_SCHEMES = frozenset({"twilio", "square"})


def build_verifier(scheme: str, secrets: Sequence[str], *, tolerance_seconds: float = 300,
                   signature_header: str | None = None, public_url: str | None = None) -> Verifier:
    """The verifier for one source; ValueError (a `SchemeConfigError` naming the field) when unusable."""
    options = SourceOptions(tolerance_seconds, signature_header, public_url)
    if public_url is not None and scheme not in URL_SIGNING_SCHEMES:
        raise SchemeConfigError(f"only {' and '.join(sorted(URL_SIGNING_SCHEMES))} sign the URL; the {scheme}"
                                " scheme does not read it", field="public_url")
    return _scheme(scheme).verifier(secrets, options)


def sign(scheme: str, body: bytes, secret: str, *, timestamp: int | None = None, msg_id: str | None = None,
         signature_header: str | None = None, public_url: str | None = None, query_string: str = "",
         content_type: str | None = None) -> dict[str, str]:
    """The headers the provider would send with `body` (for a scheme that signs the URL, to `public_url`
    with `query_string`; for standard-webhooks-v1a, `secret` is the private key)."""
    options = SignOptions(timestamp, msg_id, signature_header, public_url, query_string, content_type)
    return _scheme(scheme).sign(body, secret, options)


def _scheme(scheme: str) -> Scheme:
    if scheme not in SCHEME_TABLE:
        raise SchemeConfigError(f"unknown signature scheme {scheme!r} (known: {', '.join(SCHEMES)})", field="scheme")
    return SCHEME_TABLE[scheme]
