"""github, shopify, paystack and hmac-sha256: one HMAC over the body alone, `header: prefix + encode(HMAC)`."""

import hashlib
import hmac
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from . import parts
from .contract import BODY_ONLY, SignOptions, SourceOptions, Verified
from .errors import InvalidSignature
from .parts import BASE64, HEX

DEFAULT_HEADER = "X-Signature"


@dataclass(frozen=True)
class BodyFormat:
    header: str
    prefix: str
    encoding: parts.Encoding
    digestmod: Callable


FORMATS = {
    "github": BodyFormat("X-Hub-Signature-256", "sha256=", HEX, hashlib.sha256),
    "shopify": BodyFormat("X-Shopify-Hmac-Sha256", "", BASE64, hashlib.sha256),
    "paystack": BodyFormat("X-Paystack-Signature", "", HEX, hashlib.sha512),
    "hmac-sha256": BodyFormat(DEFAULT_HEADER, "sha256=", HEX, hashlib.sha256),
}


class BodyVerifier:
    def __init__(self, body_format: BodyFormat, keys: Sequence[bytes]):
        self._format = body_format
        self._macs = parts.KeyedMacs(keys, body_format.digestmod)

    def verify(
        self, headers: Mapping[str, str], body: bytes, now: float | None = None, *, query_string: str = ""
    ) -> Verified:
        value = parts.header(headers, self._format.header)
        if not value.startswith(self._format.prefix):
            raise InvalidSignature(f"{self._format.header} does not start with {self._format.prefix!r}")
        signature = parts.decode(self._format.encoding, value[len(self._format.prefix) :])
        parts.require_match(self._macs.digests(body), [signature])
        return BODY_ONLY


def verifier(scheme: str, secrets: Sequence[str], options: SourceOptions) -> BodyVerifier:
    keys = [parts.utf8_key(secret, label) for label, secret in parts.labelled(secrets)]
    return BodyVerifier(_format(scheme, options.signature_header), keys)


def sign(scheme: str, body: bytes, secret: str, options: SignOptions) -> dict[str, str]:
    body_format = _format(scheme, options.signature_header)
    digest = hmac.new(parts.utf8_key(secret, "secret"), body, body_format.digestmod).digest()
    return {body_format.header: body_format.prefix + body_format.encoding.encode(digest)}


def _format(scheme: str, signature_header: str | None) -> BodyFormat:
    if scheme == "hmac-sha256" and signature_header:
        return replace(FORMATS[scheme], header=signature_header)
    return FORMATS[scheme]
