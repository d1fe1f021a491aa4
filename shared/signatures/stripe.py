"""stripe: `Stripe-Signature: t=TS,v1=HEX[,v1=HEX…]` over `TS.body`, keyed with the whole `whsec_…`
string; other schemes in the header (v0) are ignored."""

from collections.abc import Mapping, Sequence

from . import parts
from .contract import BODY_ONLY, SignOptions, SourceOptions, Verified
from .errors import InvalidSignature
from .parts import HEX

HEADER = "Stripe-Signature"


class StripeVerifier:
    def __init__(self, keys: Sequence[bytes], tolerance_seconds: float):
        self._macs = parts.KeyedMacs(keys)
        self._tolerance = tolerance_seconds

    def verify(
        self, headers: Mapping[str, str], body: bytes, now: float | None = None, *, query_string: str = ""
    ) -> Verified:
        timestamp, signatures = parse_header(parts.header(headers, HEADER))
        parts.require_match(self._macs.digests(timestamp.encode("ascii"), b".", body), signatures)
        parts.require_fresh(timestamp, self._tolerance, now)
        return BODY_ONLY


def verifier(secrets: Sequence[str], options: SourceOptions) -> StripeVerifier:
    keys = [parts.utf8_key(secret, label) for label, secret in parts.labelled(secrets)]
    return StripeVerifier(keys, options.tolerance_seconds)


def sign(body: bytes, secret: str, options: SignOptions) -> dict[str, str]:
    ts = parts.now_text(options.timestamp)
    [digest] = parts.KeyedMacs([parts.utf8_key(secret, "secret")]).digests(ts.encode(), b".", body)
    return {HEADER: f"t={ts},v1={digest.hex()}"}


def parse_header(value: str) -> tuple[str, list[bytes]]:
    timestamp, signatures = None, []
    for item in value.split(","):
        name, _, text = item.strip().partition("=")
        if name == "t" and timestamp is None:
            timestamp = text
        elif name == "v1":
            signatures.append(parts.decode(HEX, text))
    if not signatures:
        raise InvalidSignature("no v1 signature in Stripe-Signature")
    return parts.timestamp_text(timestamp), signatures
