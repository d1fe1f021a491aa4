"""The pieces every scheme is built from: key bytes, keyed MACs, header reading, comparison, the clock.

Per-secret work happens once, at start-up (`KeyedMacs` keys one HMAC object
per secret, `Credentials` hashes each secret); per request a verifier only
parses headers, copies keyed objects and compares in constant time.
"""

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from .errors import (
    InvalidSignature,
    MissingSignature,
    SchemeConfigError,
    StaleTimestamp,
)

# Ten digits last until 2286; anything much longer is junk, and bounding it
# keeps int() and the clock comparison cheap and overflow-free.
_MAX_TIMESTAMP_DIGITS = 15


@dataclass(frozen=True)
class Encoding:
    encode: Callable[[bytes], str]
    decode: Callable[[str], bytes]  # raises ValueError (binascii.Error is one) on junk


HEX = Encoding(bytes.hex, binascii.a2b_hex)
BASE64 = Encoding(lambda raw: base64.b64encode(raw).decode("ascii"), lambda text: base64.b64decode(text, validate=True))


class KeyedMacs:
    """One HMAC object per key, keyed at start-up (optionally fed a fixed prefix) and copied per request."""

    def __init__(self, keys: Sequence[bytes], digestmod: Callable = hashlib.sha256, prefix: bytes = b""):
        self._prototypes = tuple(hmac.new(key, prefix, digestmod) for key in keys)

    def digests(self, *parts: bytes) -> Iterator[bytes]:
        for prototype in self._prototypes:
            mac = prototype.copy()
            for part in parts:
                mac.update(part)
            yield mac.digest()


class Credentials:
    """Secrets a provider sends as they are (a token, an API key, a password).

    Compared as SHA-256 digests with `hmac.compare_digest`: equal-length
    values, so the time taken tells nothing, not even the secret's length.
    """

    def __init__(self, secrets: Iterable[bytes]):
        self._digests = tuple(hashlib.sha256(secret).digest() for secret in secrets)

    def require(self, sent: bytes) -> None:
        digest = hashlib.sha256(sent).digest()
        if not any([hmac.compare_digest(digest, known) for known in self._digests]):  # a list: every one compared
            raise InvalidSignature("the credential matches no secret")


def labelled(secrets: Sequence[str]) -> Iterator[tuple[str, str]]:
    """(`secret 2 of 3`, secret) pairs, for messages that must not echo a secret."""
    if isinstance(secrets, str):
        raise TypeError("secrets must be a sequence of strings, not one string")
    if not secrets:
        raise SchemeConfigError("at least one secret is required")
    for i, secret in enumerate(secrets):
        label = f"secret {i + 1} of {len(secrets)}"
        if not secret:
            raise SchemeConfigError(f"{label} is empty")
        yield label, secret


def utf8_key(secret: str, label: str) -> bytes:
    try:
        return secret.encode("utf-8")
    except UnicodeEncodeError:
        raise SchemeConfigError(f"{label} is not valid UTF-8") from None


def prefixed_base64(secret: str, prefix: str, label: str, what: str) -> bytes:
    """The bytes of `prefix` + base64, decoded as the Standard Webhooks libraries do: padded,
    non-alphabet characters skipped, so any secret they accept yields the same bytes here."""
    try:
        return base64.b64decode(secret.removeprefix(prefix) + "==")
    except ValueError:
        raise SchemeConfigError(
            f"{label}: {what} is {prefix!r} followed by base64, and the part after {prefix!r} is not valid base64"
        ) from None


def header(headers: Mapping[str, str], name: str) -> str:
    value = headers.get(name)
    if value is None:
        raise MissingSignature(f"no {name} header")
    return value


def decode(encoding: Encoding, text: str) -> bytes:
    try:
        return encoding.decode(text)
    except ValueError:  # binascii.Error, or non-ASCII text
        raise InvalidSignature("the signature is not validly encoded") from None


def require_match(digests: Iterator[bytes], signatures: Sequence[bytes]) -> None:
    # Any secret (rotation) against any signature the provider sent.
    if not any(hmac.compare_digest(digest, signature) for digest in digests for signature in signatures):
        raise InvalidSignature("no signature matches")


def require_fresh(timestamp: str, tolerance_seconds: float, now: float | None) -> None:
    now = time.time() if now is None else now
    # int against float compares exactly in Python, with no overflow.
    if not now - tolerance_seconds <= int(timestamp) <= now + tolerance_seconds:
        raise StaleTimestamp(f"timestamp {timestamp} is more than {tolerance_seconds:g} s from now")


def timestamp_text(text: str | None) -> str:
    """The timestamp as sent (ASCII digits); InvalidSignature for anything else."""
    if text is None or not (text.isascii() and text.isdigit() and len(text) <= _MAX_TIMESTAMP_DIGITS):
        raise InvalidSignature("the timestamp is missing or not an integer")
    return text


def utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates from undecodable header bytes
        raise InvalidSignature("a signed header is not valid UTF-8") from None


def now_text(timestamp: int | None) -> str:
    """A signer's timestamp: the one given, else the clock's."""
    return str(int(time.time()) if timestamp is None else int(timestamp))
