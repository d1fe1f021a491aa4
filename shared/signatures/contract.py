"""What a scheme module provides, and the options a source and a signer hand it.

Each scheme module has `verifier(secrets, options) -> Verifier`, run once per
source at start-up (a `SchemeConfigError` for an unusable secret or option),
and `sign(body, secret, options) -> headers`, the headers the provider would
send (for `send-test` and the tests).
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol

from webhook_ingest.shared.event import Form


@dataclass(frozen=True, slots=True)
class Verified:
    """What a request's signature covers besides its body, for the event's identity (docs/reference.md §4).

    `signed_headers`: lower-case header names the scheme reads, each with the
    value the signature covers, or None where this request's signature covers
    none (a Svix sender signs `svix-id`: its `webhook-id`, if sent, is anyone's).
    `signed_content`: the bytes the signature covers when they are not the body
    as sent (Twilio signs the query and the sorted fields: their order is anyone's).
    `form`: the decoded form, when verifying decoded it, so the ingress does not again;
    `json`: the signature says the body is JSON (Twilio's signed `bodySHA256`), not a form.
    """

    signed_headers: Mapping[str, str | None] = field(default_factory=lambda: _NOTHING)
    signed_content: bytes | None = None
    form: Form | None = None
    json: bool = False


_NOTHING: Mapping[str, str | None] = MappingProxyType({})
BODY_ONLY = Verified()  # what most schemes return: the signature covers the body, no header the ingress reads


class Verifier(Protocol):
    def verify(
        self, headers: Mapping[str, str], body: bytes, now: float | None = None, *, query_string: str = ""
    ) -> Verified:
        """What the signature covers, when `body` is authentic; raises a `SignatureError` otherwise.

        `query_string` is the request's raw query (schemes that sign the URL).
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
