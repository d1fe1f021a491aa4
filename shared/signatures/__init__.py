"""Webhook signature verification: the schemes of docs/reference.md §4, one module each.

`build_verifier()` runs once per source at start-up and does every
per-secret step there (decoding keys, keying HMAC objects); a verifier's
`verify()` runs once per request, parses the header(s), and compares in
constant time against every listed secret (rotation). `sign()` produces the
headers a provider would send, for `send-test` and the tests.

- `errors`: what a request's failure raises (its 401 code), and start-up's `SchemeConfigError`
- `contract`: the `Verifier` protocol, what it returns (`Verified`: what the signature covers besides
  the body), and the options a scheme is built or signs with
- `parts`: keyed MACs, constant-time comparison, header and timestamp reading
- `body`: github, shopify, paystack, hmac-sha256 (an HMAC over the body)
- `stripe`, `slack`: an HMAC over a timestamp and the body
- `standard`: standard-webhooks (v1, HMAC) and standard-webhooks-v1a (ed25519)
- `twilio`, `square` (with `public_url`): an HMAC over the URL called and the body or its fields
- `credentials`: gitlab, basic-auth, api-key: a secret sent as it is
- `schemes`: the names, each with its signature headers; `build_verifier` / `sign`
"""

from .contract import BODY_ONLY, Verified, Verifier
from .errors import (
    InvalidSignature,
    MissingSignature,
    SchemeConfigError,
    SignatureError,
    StaleTimestamp,
)
from .schemes import (
    SCHEMES,
    SIGNATURE_HEADERS,
    URL_SIGNING_SCHEMES,
    build_verifier,
    sign,
)

__all__ = [
    "BODY_ONLY",
    "SCHEMES",
    "SIGNATURE_HEADERS",
    "URL_SIGNING_SCHEMES",
    "InvalidSignature",
    "MissingSignature",
    "SchemeConfigError",
    "SignatureError",
    "StaleTimestamp",
    "Verified",
    "Verifier",
    "build_verifier",
    "sign",
]
