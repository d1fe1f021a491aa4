"""Event ids, content hashes and idempotency keys (docs/reference.md §5).

A source's `event_id` selectors are compiled once, at start-up, into small
frozen dataclasses: a dotted path is split into (key, list index) steps and a
template into literal and placeholder parts, so the per-request work is dict
and list look-ups only, never parsing or regular expressions. A malformed
selector raises `SelectorError` then, so it stops the process at start instead
of failing on the first request.

The first selector that resolves to a *non-empty* value wins. Providers do not
send every id on every event (Shopify's Webhook-Id vs Event-Id, the varied
headers of plain HMAC senders), so later selectors are fallbacks; an empty
string counts as absent, because an empty id would fold unrelated events into
the one key `SOURCE:` and drop all but the first as duplicates.

A `header:` selector reads what anyone may send, unless the scheme signs
that header: the ingress resolves selectors against the request's headers
as its signature covers them (`SignedHeaders`: a Svix sender's signed
`svix-id`, never an added `webhook-id`), and an id or type read from a
header the signature does not cover (`reads_unsigned_header`) binds the
signed content to it (ingress/intake/content_bindings.py). The defaults read a
signed body before any header (docs/reference.md §4).

When no selector resolves, the id is the SHA-256 of the canonical JSON body.
Canonical JSON is *defined* by the contract as the output of Python's stdlib
`json.dumps(..., sort_keys=True, separators=(",", ":"), ensure_ascii=False)`:
these hashes are stored in `processed_events.payload_sha256` and compared
across processes and releases, so a single differing byte would turn every
redelivery into a conflict. orjson (`OPT_SORT_KEYS`) writes the same bytes
for every value without a float (it writes 1.5e-07 as 1.5e-7) at a
fifteenth of the cost (4 k instructions against 58 k for a 1 KiB body), so
a payload its parse found no float in (`float_free`) is written by orjson,
unless orjson refuses it (an integer past 64 bits, a lone surrogate,
nesting past 255 levels); anything else by stdlib json. The property tests
hold the two to the same bytes.
"""

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import orjson


class SelectorError(ValueError):
    """A selector or hash_fields path is malformed."""


DEFAULT_EVENT_ID: dict[str, tuple[str, ...]] = {
    "stripe": ("body:id",),
    "github": ("header:X-GitHub-Delivery",),
    "shopify": ("header:X-Shopify-Webhook-Id", "header:X-Shopify-Event-Id"),
    "paystack": ("{body.event}:{body.data.id}:{body.data.reference}",),
    "standard-webhooks": ("header:webhook-id", "header:svix-id"),
    # the signed body's id first: X-Event-ID is signed by nothing
    "hmac-sha256": ("body:id", "body:event_id", "body:messageId", "header:X-Event-ID"),
    "standard-webhooks-v1a": ("header:webhook-id", "header:svix-id"),
    # event_callback's event_id; a slash command's or an interaction's trigger_id (form fields)
    "slack": ("body:event_id", "body:trigger_id"),
    # Idempotency-Key (GitLab 17.4+) is kept across retries; X-Gitlab-Event-UUID is not an event's
    # id (it is shared by every hook one request or one chain of hooks triggers), X-Gitlab-Webhook-UUID
    # is new on every attempt. Older GitLab: the content hash.
    "gitlab": ("header:Idempotency-Key",),
    "twilio": ("header:I-Twilio-Idempotency-Token",),
    "square": ("body:event_id",),
    "basic-auth": ("body:id", "body:event_id", "body:messageId", "header:X-Event-ID"),
    "api-key": ("body:id", "body:event_id", "body:messageId", "header:X-Event-ID"),
}

# RFC 9110 token characters: a header name with anything else could never match.
_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")

_Step = tuple[str, int | None]  # (object key, list index when the segment is a number)


@dataclass(frozen=True, slots=True)
class HeaderSelector:
    spec: str
    name: str

    def resolve(self, headers: Mapping[str, str], payload: object) -> str | None:
        # .get on aiohttp's CIMultiDictProxy ignores case; the lower-case retry
        # serves plain dicts of lower-case names, like EventMessage.headers.
        value = headers.get(self.name) or headers.get(self.name.lower())
        return value if isinstance(value, str) and value else None


@dataclass(frozen=True, slots=True)
class BodySelector:
    spec: str
    steps: tuple[_Step, ...]

    def resolve(self, headers: Mapping[str, str], payload: object) -> str | None:
        return _as_event_id(_lookup(payload, self.steps))


@dataclass(frozen=True, slots=True)
class TemplateSelector:
    spec: str
    parts: tuple["str | HeaderSelector | BodySelector", ...]

    def resolve(self, headers: Mapping[str, str], payload: object) -> str | None:
        values = []
        for part in self.parts:
            value = part if isinstance(part, str) else part.resolve(headers, payload)
            if value is None:
                return None
            values.append(value)
        return "".join(values)


Selector = HeaderSelector | BodySelector | TemplateSelector


def parse_selectors(specs: Sequence[str]) -> tuple[Selector, ...]:
    """Compile a source's `event_id` list; an empty list means "always hash"."""
    if isinstance(specs, str):
        raise SelectorError("event_id must be a list of selectors, not one string")
    return tuple(_parse_selector(spec) for spec in specs)


def parse_hash_fields(paths: Sequence[str]) -> tuple[str, ...]:
    """Validate a source's `hash_fields` dotted paths."""
    if isinstance(paths, str):
        raise SelectorError("hash_fields must be a list of dotted paths, not one string")
    for path in paths:
        if not isinstance(path, str):
            raise SelectorError(f"hash_fields path {path!r}: must be a string")
        _compile_path(path, f"hash_fields path {path!r}")
    return tuple(paths)


def resolve_event_id(selectors: Sequence[Selector], headers: Mapping[str, str], payload: object) -> str | None:
    """The value of the first selector that resolves to a non-empty string, else None."""
    resolved = resolve_with(selectors, headers, payload)
    return None if resolved is None else resolved[0]


def resolve_with(
    selectors: Sequence[Selector], headers: Mapping[str, str], payload: object
) -> tuple[str, Selector] | None:
    """The first non-empty value and the selector it came from, else None."""
    for selector in selectors:
        value = selector.resolve(headers, payload)
        if value is not None:
            return value, selector
    return None


def reads_unsigned_header(selector: Selector, signed_headers: Mapping[str, str | None]) -> bool:
    """Whether `selector` reads a header whose value the signature does not cover
    (`signed_headers`: lower-case names with their signed values, `Verified.signed_headers`)."""
    if isinstance(selector, HeaderSelector):
        return signed_headers.get(selector.name.lower()) is None
    if isinstance(selector, TemplateSelector):
        return any(
            reads_unsigned_header(part, signed_headers) for part in selector.parts if isinstance(part, HeaderSelector)
        )
    return False


class SignedHeaders(Mapping[str, str]):
    """A request's headers as the identity selectors read them: a header the
    scheme signs has the value its signature covers, one of the scheme's
    names that this request's signature does not cover is absent (a Svix
    sender signs `svix-id`: an added `webhook-id` is nobody's); the rest as sent."""

    __slots__ = ("_headers", "_signed")

    def __init__(self, headers: Mapping[str, str], signed_headers: Mapping[str, str | None]):
        self._headers, self._signed = headers, signed_headers

    def __getitem__(self, name: str) -> str:
        lower = name.lower()
        if lower not in self._signed:
            return self._headers[name]
        value = self._signed[lower]
        if value is None:
            raise KeyError(name)
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(self._headers)

    def __len__(self) -> int:
        return len(self._headers)


def selected_value(selector: Selector, headers: Mapping[str, str], payload: object) -> object:
    """What one selector points at, untouched: a `body:` path's JSON value
    (`false`, `0`, an object), else the string it resolves to; None when absent."""
    if isinstance(selector, BodySelector):
        return _lookup(payload, selector.steps)
    return selector.resolve(headers, payload)


def canonical_json(value: object, float_free: bool = False) -> bytes:
    """docs/reference.md §5's canonical form; `float_free`: `value` holds no float (the module docstring)."""
    if float_free:
        try:
            return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:
            pass
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # Identical to strict UTF-8 for every encodable string; "surrogatepass" only
    # keeps a lone surrogate (json.loads accepts "\ud800") from raising mid-request.
    return text.encode("utf-8", "surrogatepass")


def hashed_content(payload: object, hash_fields: Sequence[str]) -> object:
    """What is hashed: the payload, or {path: value or None} over `hash_fields` only."""
    if not hash_fields:
        return payload
    return {path: _lookup(payload, _compile_path(path, path)) for path in hash_fields}


def payload_sha256(payload: object, hash_fields: Sequence[str] = (), float_free: bool = False) -> str:
    """`float_free`: `payload` holds no float (its parse found none), which makes it quicker."""
    return hashlib.sha256(canonical_json(hashed_content(payload, hash_fields), float_free)).hexdigest()


def fallback_event_id(payload_hash: str) -> str:
    return f"sha256:{payload_hash}"


def idempotency_key(source: str, event_id: str) -> str:
    return f"{source}:{event_id}"


def _parse_selector(spec: object) -> Selector:
    if not isinstance(spec, str):
        raise SelectorError(f"selector {spec!r}: must be a string")
    if not spec:
        raise SelectorError("selector '': is empty")
    if "{" in spec or "}" in spec:
        return _parse_template(spec)
    kind, colon, rest = spec.partition(":")
    if not colon or kind not in ("header", "body"):
        raise SelectorError(f"selector {spec!r}: must be header:NAME, body:dotted.path or a {{...}} template")
    return _simple_selector(kind, rest, spec)


def _parse_template(spec: str) -> TemplateSelector:
    unbalanced = SelectorError(f"selector {spec!r}: unbalanced braces")
    parts: list[str | HeaderSelector | BodySelector] = []
    rest = spec
    while rest:
        literal, brace, rest = rest.partition("{")
        if "}" in literal:
            raise unbalanced
        if literal:
            parts.append(literal)
        if brace:
            placeholder, close, rest = rest.partition("}")
            if not close or "{" in placeholder:
                raise unbalanced
            parts.append(_parse_placeholder(placeholder, spec))
    return TemplateSelector(spec, tuple(parts))


def _parse_placeholder(placeholder: str, spec: str) -> HeaderSelector | BodySelector:
    kind, _, rest = placeholder.partition(".")
    if kind not in ("header", "body"):
        problem = f"placeholder {{{placeholder}}} must be {{body.PATH}} or {{header.NAME}}"
        raise SelectorError(f"selector {spec!r}: {problem}")
    return _simple_selector(kind, rest, spec)


def _simple_selector(kind: str, rest: str, spec: str) -> HeaderSelector | BodySelector:
    if kind == "body":
        return BodySelector(f"body:{rest}", _compile_path(rest, f"selector {spec!r}"))
    if not rest:
        raise SelectorError(f"selector {spec!r}: empty header name")
    if not set(rest) <= _TOKEN_CHARS:
        raise SelectorError(f"selector {spec!r}: {rest!r} is not a valid header name")
    return HeaderSelector(f"header:{rest}", rest)


@lru_cache(maxsize=1024)
def _compile_path(path: str, where: str) -> tuple[_Step, ...]:
    """Split a dotted path into look-up steps; `where` names it in errors."""
    if not path:
        raise SelectorError(f"{where}: empty path")
    segments = path.split(".")
    for segment in segments:
        if not segment:
            raise SelectorError(f"{where}: empty segment in path {path!r}")
        if segment != segment.strip():
            # A key with edge spaces is far likelier a typo than a real field,
            # and a path that never matches would silently hash instead.
            raise SelectorError(f"{where}: segment {segment!r} has leading or trailing whitespace")
    return tuple((s, int(s) if s.isascii() and s.isdigit() else None) for s in segments)


def _lookup(value: object, steps: tuple[_Step, ...]) -> object:
    """The value at `steps`, or None when any step is missing."""
    for key, index in steps:
        if isinstance(value, dict):
            value = value.get(key)
        elif isinstance(value, list) and index is not None and index < len(value):
            value = value[index]
        else:
            return None
    return value


def _as_event_id(value: object) -> str | None:
    if isinstance(value, str):
        return value or None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None
