"""What a scheme module provides, and the options a source and a signer hand it.

Each scheme module has `verifier(secrets, options) -> Verifier`, run once per
source at start-up (a `SchemeConfigError` for an unusable secret or option),
and `sign(body, secret, options) -> headers`, the headers the provider would
send (for `send-test` and the tests).
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from webhook_ingest.shared.payloads import Form


class Verifier(Protocol):
    def verify(self, headers: Mapping[str, str], body: bytes, now: float | None = None, *,
               query_string: str = "") -> Form | None:
        """Returns when `body` is authentic; raises a `SignatureError` otherwise.

        `query_string` is the request's raw query (schemes that sign the URL).
        A verifier that had to decode a form body to check it (Twilio signs the
        decoded fields) returns the form, so the ingress does not decode it again.
        """


@dataclass(frozen=True)
class SourceOptions:
    tolerance_seconds: float = 300
    signature_header: str | None = None  # hmac-sha256's header (default X-Signature), api-key's (required)
    public_url: str | None = None  # twilio and square sign the URL they call


@dataclass(frozen=True)
class SignOptions:
    timestamp: int | None = None
    msg_id: str | None = None
    signature_header: str | None = None
    public_url: str | None = None
    query_string: str = ""
    content_type: str | None = None
