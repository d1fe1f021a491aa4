"""square: `x-square-hmacsha256-signature` = base64(HMAC-SHA256(signature key, notification URL + body)).

The notification URL is the source's `public_url`, exactly as entered in
Square's developer console (a query included); the HMAC objects are keyed
and fed it at start-up, so a request costs one HMAC over the body per key.
"""

from collections.abc import Mapping, Sequence

from . import parts, public_url
from .contract import BODY_ONLY, SignOptions, SourceOptions, Verified
from .parts import BASE64

HEADER = "x-square-hmacsha256-signature"


class SquareVerifier:
    def __init__(self, keys: Sequence[bytes], url: str):
        self._macs = parts.KeyedMacs(keys, prefix=url.encode())

    def verify(
        self, headers: Mapping[str, str], body: bytes, now: float | None = None, *, query_string: str = ""
    ) -> Verified:
        signature = parts.decode(BASE64, parts.header(headers, HEADER))
        parts.require_match(self._macs.digests(body), [signature])
        return BODY_ONLY


def verifier(secrets: Sequence[str], options: SourceOptions) -> SquareVerifier:
    url = public_url.checked(options.public_url, "square", query_allowed=True)
    return SquareVerifier([parts.utf8_key(secret, label) for label, secret in parts.labelled(secrets)], url)


def sign(body: bytes, secret: str, options: SignOptions) -> dict[str, str]:
    url = public_url.checked(options.public_url, "square", query_allowed=True)
    [digest] = parts.KeyedMacs([parts.utf8_key(secret, "secret")], prefix=url.encode()).digests(body)
    return {HEADER: BASE64.encode(digest)}
