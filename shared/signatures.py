"""Webhook signature verification for the six schemes of docs/reference.md §4.

`build_verifier()` runs once per source at start-up and does every per-secret
step there: it decodes the secret into key bytes and keys one HMAC object per
secret. `verify()` runs once per request and only parses the header(s), copies
the keyed HMAC objects (cheaper than keying again), feeds them the raw body and
compares the decoded signature bytes with `hmac.compare_digest`. It computes
one digest per secret at most, lazily, so the common case of a single matching
secret costs one HMAC.

Every failure is a `SignatureError` whose `.code` is the ingress's 401 error
string: an absent header is `MissingSignature`; anything present but wrong or
garbled is `InvalidSignature`, never another exception; a signature that
matches over a timestamp outside the tolerance is `StaleTimestamp`. The
signature is checked before the time, so a forged request with an old
timestamp is reported as invalid, not stale.

`sign()` produces the headers a provider would send, for `send-test` and tests.
"""

import base64
import binascii
import hashlib
import hmac
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

SCHEMES: tuple[str, ...] = ("stripe", "github", "shopify", "paystack", "standard-webhooks", "hmac-sha256")

STRIPE_HEADER = "Stripe-Signature"
STANDARD_PREFIXES = ("webhook-", "svix-")
_STANDARD_SECRET_PREFIX = "whsec_"
# Ten digits last until 2286; anything much longer is junk, and bounding it
# keeps int() and the clock comparison cheap and overflow-free.
_MAX_TIMESTAMP_DIGITS = 15


class SignatureError(Exception):
    """The webhook signature could not be verified."""

    code = "invalid_signature"

    def __init__(self, message: str | None = None):
        super().__init__(message or self.__doc__)


class MissingSignature(SignatureError):
    """The signature header is absent."""

    code = "missing_signature"


class InvalidSignature(SignatureError):
    """The signature is wrong or garbled."""

    code = "invalid_signature"


class StaleTimestamp(SignatureError):
    """The signature is valid but its timestamp is outside the tolerance."""

    code = "stale_timestamp"


class Verifier(Protocol):
    def verify(self, headers: Mapping[str, str], body: bytes, now: float | None = None) -> None:
        """Returns when `body` is authentic; raises a `SignatureError` otherwise."""


@dataclass(frozen=True)
class _Encoding:
    encode: Callable[[bytes], str]
    decode: Callable[[str], bytes]  # raises ValueError (binascii.Error is one) on junk


HEX = _Encoding(bytes.hex, binascii.a2b_hex)
BASE64 = _Encoding(lambda raw: base64.b64encode(raw).decode("ascii"),
                   lambda text: base64.b64decode(text, validate=True))


@dataclass(frozen=True)
class _BodyFormat:
    """A scheme that signs the body alone: `header: prefix + encode(HMAC(body))`."""

    header: str
    prefix: str
    encoding: _Encoding
    digestmod: Callable


_BODY_FORMATS = {
    "github": _BodyFormat("X-Hub-Signature-256", "sha256=", HEX, hashlib.sha256),
    "shopify": _BodyFormat("X-Shopify-Hmac-Sha256", "", BASE64, hashlib.sha256),
    "paystack": _BodyFormat("X-Paystack-Signature", "", HEX, hashlib.sha512),
    "hmac-sha256": _BodyFormat("X-Signature", "sha256=", HEX, hashlib.sha256),
}


class _KeyedMacs:
    """One HMAC object per secret, keyed at start-up and copied per request."""

    def __init__(self, keys: Sequence[bytes], digestmod: Callable = hashlib.sha256):
        self._prototypes = tuple(hmac.new(key, digestmod=digestmod) for key in keys)

    def digests(self, *parts: bytes) -> Iterator[bytes]:
        for prototype in self._prototypes:
            mac = prototype.copy()
            for part in parts:
                mac.update(part)
            yield mac.digest()


class BodyVerifier:
    """github, shopify, paystack and hmac-sha256: one signature over the body."""

    def __init__(self, body_format: _BodyFormat, keys: Sequence[bytes]):
        self._format = body_format
        self._macs = _KeyedMacs(keys, body_format.digestmod)

    def verify(self, headers: Mapping[str, str], body: bytes, now: float | None = None) -> None:
        value = _header(headers, self._format.header)
        if not value.startswith(self._format.prefix):
            raise InvalidSignature(f"{self._format.header} does not start with {self._format.prefix!r}")
        signature = _decode(self._format.encoding, value[len(self._format.prefix):])
        _require_match(self._macs.digests(body), [signature])


class StripeVerifier:
    """`Stripe-Signature: t=TS,v1=HEX[,v1=HEX…]` over `TS.body`; other schemes (v0) ignored."""

    def __init__(self, keys: Sequence[bytes], tolerance_seconds: float):
        self._macs = _KeyedMacs(keys)
        self._tolerance = tolerance_seconds

    def verify(self, headers: Mapping[str, str], body: bytes, now: float | None = None) -> None:
        timestamp, signatures = _parse_stripe_header(_header(headers, STRIPE_HEADER))
        _require_match(self._macs.digests(timestamp.encode("ascii"), b".", body), signatures)
        _require_fresh(timestamp, self._tolerance, now)


class StandardWebhooksVerifier:
    """`webhook-signature: v1,B64 [v1,B64…]` over `id.ts.body` (or the `svix-*` headers)."""

    def __init__(self, keys: Sequence[bytes], tolerance_seconds: float):
        self._macs = _KeyedMacs(keys)
        self._tolerance = tolerance_seconds

    def verify(self, headers: Mapping[str, str], body: bytes, now: float | None = None) -> None:
        msg_id, timestamp, signature_header = _standard_headers(headers)
        signatures = [_decode(BASE64, text) for version, _, text in
                      (entry.partition(",") for entry in signature_header.split(" ")) if version == "v1"]
        if not signatures:
            raise InvalidSignature("no v1 signature in the signature header")
        _require_match(self._macs.digests(_utf8(msg_id), b".", timestamp.encode("ascii"), b".", body), signatures)
        _require_fresh(timestamp, self._tolerance, now)


def build_verifier(scheme: str, secrets: Sequence[str], *, tolerance_seconds: float = 300,
                   signature_header: str = "X-Signature") -> Verifier:
    """The verifier for one source; ValueError for an unknown scheme or an unusable secret."""
    _check_scheme(scheme)
    if isinstance(secrets, str):
        raise TypeError("secrets must be a sequence of strings, not one string")
    if not secrets:
        raise ValueError("at least one secret is required")
    keys = [_signing_key(scheme, secret, f"secret {i + 1} of {len(secrets)}") for i, secret in enumerate(secrets)]
    if scheme == "stripe":
        return StripeVerifier(keys, tolerance_seconds)
    if scheme == "standard-webhooks":
        return StandardWebhooksVerifier(keys, tolerance_seconds)
    return BodyVerifier(_body_format(scheme, signature_header), keys)


def sign(scheme: str, body: bytes, secret: str, *, timestamp: int | None = None, msg_id: str | None = None,
         signature_header: str = "X-Signature") -> dict[str, str]:
    """The signature headers the provider would send with `body`."""
    _check_scheme(scheme)
    key = _signing_key(scheme, secret, "secret")
    ts = str(int(time.time()) if timestamp is None else int(timestamp))
    if scheme == "stripe":
        return {STRIPE_HEADER: f"t={ts},v1={_hmac_sha256(key, ts.encode(), b'.', body).hex()}"}
    if scheme == "standard-webhooks":
        msg_id = msg_id or f"msg_{uuid.uuid4().hex}"
        signature = BASE64.encode(_hmac_sha256(key, msg_id.encode(), b".", ts.encode(), b".", body))
        return {"webhook-id": msg_id, "webhook-timestamp": ts, "webhook-signature": f"v1,{signature}"}
    body_format = _body_format(scheme, signature_header)
    digest = hmac.new(key, body, body_format.digestmod).digest()
    return {body_format.header: body_format.prefix + body_format.encoding.encode(digest)}


def _check_scheme(scheme: str) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"unknown signature scheme {scheme!r} (known: {', '.join(SCHEMES)})")


def _body_format(scheme: str, signature_header: str) -> _BodyFormat:
    body_format = _BODY_FORMATS[scheme]
    if scheme == "hmac-sha256":
        return _BodyFormat(signature_header, body_format.prefix, body_format.encoding, body_format.digestmod)
    return body_format


def _signing_key(scheme: str, secret: str, label: str) -> bytes:
    """Key bytes; stripe keys with the whole `whsec_…` string, standard-webhooks with its decoded part."""
    if not secret:
        raise ValueError(f"{label} is empty")
    if scheme != "standard-webhooks":
        try:
            return secret.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{label} is not valid UTF-8") from None
    return _standard_webhooks_key(secret, label)


def _standard_webhooks_key(secret: str, label: str) -> bytes:
    encoded = secret.removeprefix(_STANDARD_SECRET_PREFIX)
    try:
        # As the reference library does: pad, and skip non-alphabet characters,
        # so any secret it accepts yields the same key bytes here.
        key = base64.b64decode(encoded + "==")
    except ValueError:
        raise ValueError(f"{label}: a standard-webhooks secret is 'whsec_' followed by base64, "
                         "and the part after 'whsec_' is not valid base64") from None
    if not key:
        raise ValueError(f"{label}: the standard-webhooks secret decodes to no key bytes")
    return key


def _hmac_sha256(key: bytes, *parts: bytes) -> bytes:
    return next(_KeyedMacs([key]).digests(*parts))


def _header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if value is None:
        raise MissingSignature(f"no {name} header")
    return value


def _decode(encoding: _Encoding, text: str) -> bytes:
    try:
        return encoding.decode(text)
    except ValueError:  # binascii.Error, or non-ASCII text
        raise InvalidSignature("the signature is not validly encoded") from None


def _require_match(digests: Iterator[bytes], signatures: Sequence[bytes]) -> None:
    # Any secret (rotation) against any signature the provider sent.
    if not any(hmac.compare_digest(digest, signature) for digest in digests for signature in signatures):
        raise InvalidSignature("no signature matches")


def _require_fresh(timestamp: str, tolerance_seconds: float, now: float | None) -> None:
    now = time.time() if now is None else now
    # int against float compares exactly in Python, with no overflow.
    if not now - tolerance_seconds <= int(timestamp) <= now + tolerance_seconds:
        raise StaleTimestamp(f"timestamp {timestamp} is more than {tolerance_seconds:g} s from now")


def _timestamp(text: str | None) -> str:
    """The timestamp as sent (ASCII digits); InvalidSignature for anything else."""
    if text is None or not (text.isascii() and text.isdigit() and len(text) <= _MAX_TIMESTAMP_DIGITS):
        raise InvalidSignature("the timestamp is missing or not an integer")
    return text


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from undecodable header bytes
        raise InvalidSignature("a signed header is not valid UTF-8") from None


def _parse_stripe_header(value: str) -> tuple[str, list[bytes]]:
    timestamp, signatures = None, []
    for item in value.split(","):
        name, _, text = item.strip().partition("=")
        if name == "t" and timestamp is None:
            timestamp = text
        elif name == "v1":
            signatures.append(_decode(HEX, text))
    if not signatures:
        raise InvalidSignature("no v1 signature in Stripe-Signature")
    return _timestamp(timestamp), signatures


def _standard_headers(headers: Mapping[str, str]) -> tuple[str, str, str]:
    """(id, timestamp, signature header) from the webhook-* names, else the svix-* ones."""
    for prefix in STANDARD_PREFIXES:
        signature_header = headers.get(prefix + "signature")
        if signature_header is not None:
            msg_id = headers.get(prefix + "id")
            if not msg_id:
                raise InvalidSignature(f"{prefix}signature without {prefix}id")
            return msg_id, _timestamp(headers.get(prefix + "timestamp")), signature_header
    raise MissingSignature("no webhook-signature (or svix-signature) header")
