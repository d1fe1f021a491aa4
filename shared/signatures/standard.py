"""Standard Webhooks: `webhook-id`, `webhook-timestamp`, `webhook-signature: VERSION,B64 [VERSION,B64 …]`
(or the `svix-*` names) over `id.timestamp.body`.

- `standard-webhooks`: `v1`, HMAC-SHA256 keyed with the base64 part of a `whsec_…` secret.
- `standard-webhooks-v1a`: `v1a`, ed25519 under the public keys (`whpk_…`) the sources file lists;
  the private key (`whsk_…`) never comes here.

A header may carry both versions (a sender moving from one to the other);
each verifier reads only its own entries.

cryptography is imported by the v1a functions, when a source of that scheme
is loaded or signed for: every process imports this module (the sources
file names schemes), and most deployments have no v1a source.
"""

import base64
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from . import parts
from .contract import SignOptions, SourceOptions, Verified
from .errors import InvalidSignature, MissingSignature, SchemeConfigError
from .parts import BASE64

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

PREFIXES = ("webhook-", "svix-")
SECRET_PREFIX = "whsec_"
PUBLIC_KEY_PREFIX = "whpk_"
PRIVATE_KEY_PREFIX = "whsk_"
# An ed25519 check costs ~100x an HMAC: a header of hundreds of junk entries
# must not buy that many checks. Senders send one per key they sign with.
MAX_ASYMMETRIC_SIGNATURES = 8
_ED25519_SIGNATURE_BYTES = 64


class StandardWebhooksVerifier:
    """v1: HMAC-SHA256."""

    def __init__(self, keys: Sequence[bytes], tolerance_seconds: float):
        self._macs = parts.KeyedMacs(keys)
        self._tolerance = tolerance_seconds

    def verify(
        self, headers: Mapping[str, str], body: bytes, now: float | None = None, *, query_string: str = ""
    ) -> Verified:
        prefix, msg_id, timestamp, signature_header = message_headers(headers)
        signatures = signatures_of("v1", signature_header)
        parts.require_match(
            self._macs.digests(parts.utf8(msg_id), b".", timestamp.encode("ascii"), b".", body), signatures
        )
        parts.require_fresh(timestamp, self._tolerance, now)
        return signed(prefix, msg_id, timestamp)


class AsymmetricVerifier:
    """v1a: ed25519."""

    def __init__(self, public_keys: Sequence["Ed25519PublicKey"], tolerance_seconds: float):
        self._public_keys = tuple(public_keys)
        self._tolerance = tolerance_seconds

    def verify(
        self, headers: Mapping[str, str], body: bytes, now: float | None = None, *, query_string: str = ""
    ) -> Verified:
        prefix, msg_id, timestamp, signature_header = message_headers(headers)
        signatures = signatures_of("v1a", signature_header)
        if len(signatures) > MAX_ASYMMETRIC_SIGNATURES:
            raise InvalidSignature(f"more than {MAX_ASYMMETRIC_SIGNATURES} v1a signatures")
        message = b".".join((parts.utf8(msg_id), timestamp.encode("ascii"), body))
        if not any(_signed_by(key, signature, message) for key in self._public_keys for signature in signatures):
            raise InvalidSignature("no signature matches")
        parts.require_fresh(timestamp, self._tolerance, now)
        return signed(prefix, msg_id, timestamp)


def verifier(secrets: Sequence[str], options: SourceOptions) -> StandardWebhooksVerifier:
    return StandardWebhooksVerifier(
        [_hmac_key(secret, label) for label, secret in parts.labelled(secrets)], options.tolerance_seconds
    )


def asymmetric_verifier(secrets: Sequence[str], options: SourceOptions) -> AsymmetricVerifier:
    return AsymmetricVerifier(
        [_public_key(secret, label) for label, secret in parts.labelled(secrets)], options.tolerance_seconds
    )


def sign(body: bytes, secret: str, options: SignOptions) -> dict[str, str]:
    msg_id, ts = options.msg_id or f"msg_{uuid.uuid4().hex}", parts.now_text(options.timestamp)
    [digest] = parts.KeyedMacs([_hmac_key(secret, "secret")]).digests(msg_id.encode(), b".", ts.encode(), b".", body)
    return {"webhook-id": msg_id, "webhook-timestamp": ts, "webhook-signature": f"v1,{BASE64.encode(digest)}"}


def asymmetric_sign(body: bytes, secret: str, options: SignOptions) -> dict[str, str]:
    """`secret` is the private key: `whsk_` + base64 of the 32-byte seed (or of seed + public key, 64 bytes)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    msg_id, ts = options.msg_id or f"msg_{uuid.uuid4().hex}", parts.now_text(options.timestamp)
    seed = parts.prefixed_base64(secret, PRIVATE_KEY_PREFIX, "secret", "a private key")[:32]
    signature = Ed25519PrivateKey.from_private_bytes(seed).sign(b".".join((msg_id.encode(), ts.encode(), body)))
    return {"webhook-id": msg_id, "webhook-timestamp": ts, "webhook-signature": f"v1a,{BASE64.encode(signature)}"}


def public_key_text(private_key: str) -> str:
    """The `whpk_…` text of a `whsk_…` private key."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    seed = parts.prefixed_base64(private_key, PRIVATE_KEY_PREFIX, "secret", "a private key")[:32]
    raw = Ed25519PrivateKey.from_private_bytes(seed).public_key().public_bytes_raw()
    return PUBLIC_KEY_PREFIX + base64.b64encode(raw).decode()


def message_headers(headers: Mapping[str, str]) -> tuple[str, str, str, str]:
    """(prefix, id, timestamp, signature header) from the webhook-* names, else the svix-* ones."""
    for prefix in PREFIXES:
        signature_header = headers.get(prefix + "signature")
        if signature_header is not None:
            msg_id = headers.get(prefix + "id")
            if not msg_id:
                raise InvalidSignature(f"{prefix}signature without {prefix}id")
            return prefix, msg_id, parts.timestamp_text(headers.get(prefix + "timestamp")), signature_header
    raise MissingSignature("no webhook-signature (or svix-signature) header")


def signed(prefix: str, msg_id: str, timestamp: str) -> Verified:
    """The id and timestamp of the family the signature covers; the other family's names are anyone's."""
    signed_headers: dict[str, str | None] = {}
    for family in PREFIXES:
        signed_headers[family + "id"] = msg_id if family == prefix else None
        signed_headers[family + "timestamp"] = timestamp if family == prefix else None
    return Verified(signed_headers)


def signatures_of(version: str, signature_header: str) -> list[bytes]:
    """The decoded signatures of one version; entries of other versions are skipped unread."""
    signatures = [
        parts.decode(BASE64, text)
        for name, _, text in (entry.partition(",") for entry in signature_header.split(" "))
        if name == version
    ]
    if not signatures:
        raise InvalidSignature(f"no {version} signature in the signature header")
    return signatures


def _signed_by(key: "Ed25519PublicKey", signature: bytes, message: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature as BadEd25519Signature

    if len(signature) != _ED25519_SIGNATURE_BYTES:
        return False
    try:
        key.verify(signature, message)
    except BadEd25519Signature:
        return False
    return True


def _hmac_key(secret: str, label: str) -> bytes:
    key = parts.prefixed_base64(secret, SECRET_PREFIX, label, "a standard-webhooks secret")
    if not key:
        raise SchemeConfigError(f"{label}: the standard-webhooks secret decodes to no key bytes")
    return key


def _public_key(secret: str, label: str) -> "Ed25519PublicKey":
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    for prefix, what in (
        (SECRET_PREFIX, "a v1 (HMAC) secret: use scheme standard-webhooks"),
        (PRIVATE_KEY_PREFIX, "the private key: list the public key, whpk_…, instead"),
    ):
        if secret.startswith(prefix):
            raise SchemeConfigError(f"{label} is {what}")
    raw = parts.prefixed_base64(secret, PUBLIC_KEY_PREFIX, label, "a standard-webhooks-v1a public key")
    try:
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        raise SchemeConfigError(f"{label}: an ed25519 public key is 32 bytes, this one decodes to {len(raw)}") from None
