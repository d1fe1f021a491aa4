"""slack: `X-Slack-Signature: v0=HEX` over `v0:{X-Slack-Request-Timestamp}:{body}`, HMAC-SHA256 keyed
with the app's signing secret; stale past the source's tolerance (300 s, Slack's five minutes)."""

from collections.abc import Mapping, Sequence

from . import parts
from .contract import BODY_ONLY, SignOptions, SourceOptions, Verified
from .errors import InvalidSignature
from .parts import HEX

SIGNATURE_HEADER = "X-Slack-Signature"
TIMESTAMP_HEADER = "X-Slack-Request-Timestamp"
VERSION = "v0"


class SlackVerifier:
    def __init__(self, keys: Sequence[bytes], tolerance_seconds: float):
        self._macs = parts.KeyedMacs(keys, prefix=f"{VERSION}:".encode())
        self._tolerance = tolerance_seconds

    def verify(
        self, headers: Mapping[str, str], body: bytes, now: float | None = None, *, query_string: str = ""
    ) -> Verified:
        signature = parse_signature(parts.header(headers, SIGNATURE_HEADER))
        timestamp = parts.timestamp_text(headers.get(TIMESTAMP_HEADER))
        parts.require_match(self._macs.digests(timestamp.encode("ascii"), b":", body), [signature])
        parts.require_fresh(timestamp, self._tolerance, now)
        return BODY_ONLY


def parse_signature(value: str) -> bytes:
    version, equals, text = value.partition("=")
    if version != VERSION or not equals:
        raise InvalidSignature(f"{SIGNATURE_HEADER} is not {VERSION}=HEX")
    return parts.decode(HEX, text)


def verifier(secrets: Sequence[str], options: SourceOptions) -> SlackVerifier:
    keys = [parts.utf8_key(secret, label) for label, secret in parts.labelled(secrets)]
    return SlackVerifier(keys, options.tolerance_seconds)


def sign(body: bytes, secret: str, options: SignOptions) -> dict[str, str]:
    ts = parts.now_text(options.timestamp)
    [digest] = parts.KeyedMacs([parts.utf8_key(secret, "secret")]).digests(f"{VERSION}:{ts}:".encode(), body)
    return {TIMESTAMP_HEADER: ts, SIGNATURE_HEADER: f"{VERSION}={digest.hex()}"}
