"""twilio: `X-Twilio-Signature` = base64(HMAC(secret, URL + each form field's name and value)), as
`twilio.request_validator.RequestValidator` checks it.

- URL: the source's `public_url` plus the request's own query string, as
  received; tried as written and with the default port added or removed.
- A form body: its fields sorted by name, a name's distinct values sorted,
  each appended as name + value. The order of the fields, and how often a
  value is sent, are not signed: the content an event is bound to is what
  is (`Verified.signed_content`).
- A JSON body is covered only through the URL: Twilio adds
  `bodySHA256=<hex SHA-256 of the body>` to the query, and that must match.
  The signed query, never the unsigned Content-Type, says which of the two
  a body is: with `bodySHA256` JSON, without it a form (as Twilio's own
  validator reads it).
- HMAC-SHA1 keyed with the account's auth token, or, when the request names
  it in `X-Twilio-Webhooks-Signature-Settings: …,algorithm=HMAC_SHA256`,
  HMAC-SHA256 keyed with a shared key's secret; list either (or both) as secrets.
"""

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from urllib.parse import parse_qs

from webhook_ingest.shared.event import Form, payloads

from . import parts, public_url
from .contract import SignOptions, SourceOptions, Verified
from .errors import InvalidSignature
from .parts import BASE64

SIGNATURE_HEADER = "X-Twilio-Signature"
SETTINGS_HEADER = "X-Twilio-Webhooks-Signature-Settings"
ALGORITHMS = {"HMAC_SHA1": hashlib.sha1, "HMAC_SHA256": hashlib.sha256}
DEFAULT_ALGORITHM = "HMAC_SHA1"
BODY_HASH_PARAMETER = "bodySHA256"
JSON_BODY = Verified(json=True)


class TwilioVerifier:
    def __init__(self, keys: Sequence[bytes], url: str):
        self._macs = {name: parts.KeyedMacs(keys, digestmod) for name, digestmod in ALGORITHMS.items()}
        self._urls = tuple(variant.encode() for variant in public_url.with_and_without_port(url))

    def verify(
        self, headers: Mapping[str, str], body: bytes, now: float | None = None, *, query_string: str = ""
    ) -> Verified:
        signature = parts.decode(BASE64, parts.header(headers, SIGNATURE_HEADER))
        macs = self._macs[algorithm(headers.get(SETTINGS_HEADER))]
        query = parts.utf8(f"?{query_string}" if query_string else "")
        body_hash = parse_qs(query_string).get(BODY_HASH_PARAMETER)
        form = None if body_hash else _form(body)
        if body_hash:
            _require_body_hash(body, body_hash[0])
        fields = b"" if form is None else signed_fields(form)
        parts.require_match((digest for url in self._urls for digest in macs.digests(url, query, fields)), [signature])
        return JSON_BODY if form is None else Verified(signed_content=query + fields, form=form)


def algorithm(settings: str | None) -> str:
    """The algorithm `X-Twilio-Webhooks-Signature-Settings` names (`key=…,algorithm=…`); HMAC_SHA1 without one."""
    for item in (settings or "").split(","):
        name, equals, value = item.partition("=")
        if equals and name.strip() == "algorithm" and value.strip():
            if value.strip().upper() not in ALGORITHMS:
                raise InvalidSignature(f"unknown signature algorithm in {SETTINGS_HEADER}")
            return value.strip().upper()
    return DEFAULT_ALGORITHM


def signed_fields(form: Form) -> bytes:
    values = payloads.values_of(form)
    return "".join(name + value for name in sorted(values) for value in sorted(set(values[name]))).encode()


def verifier(secrets: Sequence[str], options: SourceOptions) -> TwilioVerifier:
    url = public_url.checked(options.public_url, "twilio", query_allowed=False)
    return TwilioVerifier([parts.utf8_key(secret, label) for label, secret in parts.labelled(secrets)], url)


def sign(body: bytes, secret: str, options: SignOptions) -> dict[str, str]:
    """For a body that is not a form, `options.query_string` must hold `body_hash_query(body)`."""
    url = public_url.checked(options.public_url, "twilio", query_allowed=False)
    query = f"?{options.query_string}" if options.query_string else ""
    fields = signed_fields(payloads.parse_form(body)) if payloads.is_form(options.content_type) else b""
    digest = hmac.new(parts.utf8_key(secret, "secret"), (url + query).encode() + fields, hashlib.sha1).digest()
    return {SIGNATURE_HEADER: BASE64.encode(digest)}


def body_hash_query(body: bytes) -> str:
    return f"{BODY_HASH_PARAMETER}={hashlib.sha256(body).hexdigest()}"


def _form(body: bytes) -> Form:
    try:
        return payloads.parse_form(body)
    except ValueError:
        raise InvalidSignature("the form body is not UTF-8 url-encoding") from None


def _require_body_hash(body: bytes, sent: str) -> None:
    if not hmac.compare_digest(hashlib.sha256(body).hexdigest().encode(), sent.encode("utf-8", "replace")):
        raise InvalidSignature(f"{BODY_HASH_PARAMETER} does not match the body")
