"""`POST /webhooks/{source}`: verify, identify, publish, then answer.

The checks run in the order docs/reference.md §6 fixes, the first failure answering:
source (404), client address (403), a slot (503), size (413, the body read
within a time limit; 429 for a slow body of a client with too many slow
ones), signature (401; 429 once the client's failure budget is spent, a
valid signature never refused for it), the source's rate limit (429: only
verified requests spend it), JSON or form (400; a body that starts as JSON
is read as JSON whatever the unsigned Content-Type says), event id (400),
for an id or type read from a header the signature does not cover its
signed content's binding (200 `duplicate` of the first key when it came
with another: ingress/intake/content_bindings.py), then the source's `ignore`
rules (200 `ignored`, nothing queued), and for a source with routes whether
any takes it (else 200 `ignored`, rule `no route`).
A 200 `accepted` is only sent once the event is durably stored: the broker
confirmed the message, or (RabbitMQ away) the Postgres outbox committed it;
for an ordered source or route, its lane's row committed in Postgres
(ingress/intake/ordered.py; Postgres away: 503), a routed event's rows
before the message for its unordered routes.
"""

import functools
import time

from aiohttp import web

from webhook_ingest.ingress.appkeys import sources_key
from webhook_ingest.ingress.archive import arrivals_key
from webhook_ingest.ingress.publishing import GivenUp, OutboxUnavailable, Publisher, outbox_key, publisher_key
from webhook_ingest.ingress.responses import Rejected, error, json_response
from webhook_ingest.shared import storable_json
from webhook_ingest.shared.errors import BrokerUnavailable
from webhook_ingest.shared.event import (
    MAX_EVENT_ID_BYTES,
    EventMessage,
    headers_fit,
    new_arrival,
    payloads,
    provider_headers,
    utf8_text,
)
from webhook_ingest.shared.event import ids as event_id
from webhook_ingest.shared.event import types as event_type
from webhook_ingest.shared.observability import get_logger, metrics, tracing
from webhook_ingest.shared.signatures import SignatureError, Verified
from webhook_ingest.shared.sources import Source

from . import ordered
from .content_bindings import content_bindings_key
from .done_markers import done_markers_key
from .failure_budget import failure_budget_key
from .limits import check_client_address, check_rate_limit, read_body_within
from .slots import Slot, slots_key

log = get_logger(__name__)

RETRY_AFTER_SECONDS = "5"


async def receive_webhook(request: web.Request) -> web.Response:
    started = time.perf_counter()
    source = request.app[sources_key].get(request.match_info["source"])
    label = source.name if source else "unknown"
    try:
        response = await _accept(request, source)
    except Rejected as rejection:
        response = rejection.response
    answered, duration = _request_series(label, response.status)
    answered.inc()
    duration.observe(time.perf_counter() - started)
    return response


@functools.cache  # bounded: a source's name or "unknown", times the statuses the ingress answers
def _request_series(label: str, status: int) -> tuple:
    """The two series a request moves: `.labels()` looks its child up under a lock, 8 µs a request."""
    return metrics.ingress_requests.labels(label, str(status)), metrics.ingress_request_duration.labels(label)


async def _accept(request: web.Request, source: Source | None) -> web.Response:
    if source is None:
        raise Rejected(error(404, "unknown_source"))
    check_client_address(request, source)
    with request.app[slots_key].taken(request.remote) as slot:  # the headers vetted: now it may hold one
        body, verified = await _verified_body(request, source, slot)
        await check_rate_limit(request, source)  # the provider's budget: spent by verified requests only
        return await _queued(request, source, body, verified)


async def _queued(request: web.Request, source: Source, body: bytes, verified: Verified) -> web.Response:
    payload, as_form, float_free = _payload(request, body, verified)
    if (challenge := _slack_challenge(source, payload)) is not None:
        return json_response(200, {"challenge": challenge})
    event, unsigned_id = _build_event(source, request, body, payload, verified, as_form, float_free)
    tracing.describe(event)  # the request's span, found by the event's key
    rule = source.ignore.matching(event.headers, payload)
    if first_key := await _bound_elsewhere(request, source, event, payload, verified, unsigned_id, rule):
        log.warning("replayed_content", source=source.name, key=event.key, first_key=first_key)
        metrics.ingress_replays.labels(source.name).inc()
        return json_response(200, {"status": "duplicate", "key": first_key})
    if rule:
        return _ignored(request, source, event, payload, rule)
    if source.routes and not source.routes_taking(event.headers, payload):
        return _ignored(request, source, event, payload, NO_ROUTE)
    # a routed event's own key never completes (its routes' KEY#ROUTE do), and
    # another event's route key may be this very key: `evt` on route `billing`
    # is `evt#billing`'s key (docs/design.md, "Routes")
    if not source.routes and await request.app[done_markers_key].completed_with(event.key, event.payload_sha256):
        log.debug("duplicate", source=source.name, key=event.key)  # completed, same payload: nothing to queue
        request.app[arrivals_key].arrived(event, source, payload, duplicate=True)
        return json_response(200, {"status": "duplicate", "key": event.key})
    lanes = ordered.laned(source, event, payload)
    if lanes.rows:  # first: a 503 here has queued nothing
        await _store_in_lanes(request.app, event, lanes.rows)
    if lanes.unordered is not None:
        await _store(request.app, lanes.unordered)
    request.app[arrivals_key].arrived(event, source, payload)  # written in a batch, after this answer
    log.debug("accepted", source=source.name, key=event.key)
    return json_response(200, {"status": "accepted", "key": event.key})


NO_ROUTE = "no route"  # the `rule` of an event no route of its source takes


async def _bound_elsewhere(
    request: web.Request,
    source: Source,
    event: EventMessage,
    payload: dict,
    verified: Verified,
    unsigned_id: bool,
    rule: str | None,
) -> str | None:
    """When the id, the type or an ignore rule read a header the signature does not cover, or the signature
    covers less than the body as sent (a Twilio form: several forms sign alike): the key this
    signed content was first accepted under, if that is another key under its type, or this key under
    another type or another ignore decision (ingress/intake/content_bindings.py)."""
    kind = event_id.resolve_with(source.event_type_selectors, event.headers, payload)
    unsigned_rules = source.ignore.read_unsigned_headers(verified.signed_headers)
    if (
        not unsigned_id
        and not unsigned_rules
        and verified.signed_content is None
        and (kind is None or not event_id.reads_unsigned_header(kind[1], verified.signed_headers))
    ):
        return None  # id, type and rules signed (or none): a replay is the same key, a duplicate as any copy
    signed_content = event.body if verified.signed_content is None else verified.signed_content
    type_name = None if kind is None else event_type.resolve(source.event_type_selectors, event.headers, payload)
    return await request.app[content_bindings_key].first_key(
        source.name, source.scheme, signed_content, event.key, type_name, rule if unsigned_rules else None
    )


def _slack_challenge(source: Source, payload: object) -> str | None:
    """Slack's Events API checks a Request URL with a signed
    `url_verification` and enables it only when its `challenge` comes back;
    a handshake, not an event: answered, never queued or archived."""
    if source.scheme != "slack" or not isinstance(payload, dict) or payload.get("type") != "url_verification":
        return None
    challenge = payload.get("challenge")
    return challenge if isinstance(challenge, str) else None


def _ignored(request: web.Request, source: Source, event: EventMessage, payload: dict, rule: str) -> web.Response:
    """A rule of the source's `ignore` matched: answered, archived and counted, never queued."""
    metrics.ingress_ignored.labels(source.name, rule).inc()
    request.app[arrivals_key].ignored(event, source, payload, rule)
    log.debug("ignored", source=source.name, key=event.key, rule=rule)
    return json_response(200, {"status": "ignored", "key": event.key, "rule": rule})


async def _store_in_lanes(app: web.Application, event: EventMessage, rows: ordered.Rows) -> None:
    """An ordered event's rows, committed in Postgres (ingress/intake/ordered.py), else 503:
    no broker fallback, which could not place the event before later ones of its lane."""
    try:
        await app[ordered.ordered_intake_key].store(event, rows)
    except ordered.OrderedUnavailable as exc:
        log.warning("unavailable", source=event.source, key=event.key, postgres=str(exc), ordered=True)
        raise Rejected(error(503, "unavailable", {"Retry-After": RETRY_AFTER_SECONDS})) from exc


async def _store(app: web.Application, event: EventMessage) -> None:
    """Durably: a broker confirm, else one committed outbox insert, else the
    broker after all (the publish given up on, or one made now), else 503."""
    try:
        return await app[publisher_key].publish(event, live=True)
    except GivenUp as exc:
        given_up = exc
    try:
        await app[outbox_key].store(event)
    except OutboxUnavailable as exc:
        return await _publish_anyway(app[publisher_key], event, given_up, str(exc))
    log.info("stored_in_outbox", source=event.source, key=event.key, broker=str(given_up))


async def _publish_anyway(publisher: Publisher, event: EventMessage, given_up: GivenUp, outbox_error: str) -> None:
    """No outbox: a broker that was only suspect may still confirm (Postgres
    away and a burst on a healthy broker, docs/design.md "The outbox")."""
    try:
        await publisher.publish_anyway(event, given_up)
    except BrokerUnavailable as exc:
        log.warning("unavailable", source=event.source, key=event.key, broker=str(exc), outbox=outbox_error)
        raise Rejected(error(503, "unavailable", {"Retry-After": RETRY_AFTER_SECONDS})) from exc
    log.info("published_without_outbox", source=event.source, key=event.key, outbox=outbox_error)


async def _verified_body(request: web.Request, source: Source, slot: Slot) -> tuple[bytes, Verified]:
    """The body, read and its signature verified (and what the signature covers besides),
    whatever its client's failure budget: a failure spends it, and past it is answered 429."""
    try:
        body = await read_body_within(request, slot, source.max_body_bytes)
        slot.body_arrived()
        verified = _verify(source, request, body)
    except Rejected as failure:
        raise request.app[failure_budget_key].charged(request.remote, failure) from None
    return body, verified


def _verify(source: Source, request: web.Request, body: bytes) -> Verified:
    try:
        return source.verifier.verify(request.headers, body, query_string=request.rel_url.raw_query_string)
    except SignatureError as exc:
        if request.app[failure_budget_key].has_failures_left(request.remote):  # else one too_many_failures a minute
            log.info("signature_rejected", source=source.name, reason=exc.code)
        challenge = getattr(source.verifier, "challenge", None)  # basic-auth's WWW-Authenticate
        raise Rejected(error(401, exc.code, {"WWW-Authenticate": challenge} if challenge else None)) from exc


def _payload(request: web.Request, body: bytes, verified: Verified) -> tuple[dict, bool, bool]:
    """The handler's payload, whether it is a form, and whether it holds no float (a form never
    does; its hash is then quicker): JSON when the body starts as JSON does, whatever the
    unsigned Content-Type says (shared/event/payloads.py)."""
    if verified.form is not None:  # decoded to verify it (twilio), which signs the set of its fields
        if payloads.repeats_a_field(verified.form):
            raise Rejected(error(400, "invalid_form"))
        return verified.form, True, False
    if verified.json or payloads.reads_as_json(body) or not payloads.is_form(request.headers.get("Content-Type")):
        return _json_payload(body)
    try:
        return payloads.parse_form(body), True, False
    except ValueError as exc:  # UnicodeDecodeError included
        raise Rejected(error(400, "invalid_form")) from exc


def _json_payload(body: bytes) -> tuple[dict, bool, bool]:
    payload, held_a_float = _parse_json(body)
    return payload, False, not held_a_float


def _parse_json(body: bytes) -> tuple[dict, bool]:
    """The payload, and whether it held a float.
    Stdlib json, not orjson: orjson turns integers past 64 bits into floats,
    silently changing the payload and its hash. storable_json also refuses
    what Postgres's jsonb would (accepted, it could be stored nowhere)."""
    try:
        payload, held_a_float = storable_json.parse_noting_floats(body)
    except ValueError as exc:  # UnicodeDecodeError and NotStorable included
        raise Rejected(error(400, "invalid_json")) from exc
    if not isinstance(payload, dict):
        raise Rejected(error(400, "invalid_json"))
    return payload, held_a_float


def _build_event(
    source: Source,
    request: web.Request,
    body: bytes,
    payload: dict,
    verified: Verified,
    as_form: bool,
    float_free: bool,
) -> tuple[EventMessage, bool]:
    """The event, and whether its id was read from a header the signature does not cover."""
    payload_hash = event_id.payload_sha256(payload, source.hash_fields, float_free)
    resolved_id, unsigned_id = _event_id(source, request, payload, payload_hash, verified)
    headers = provider_headers(request.headers, also_dropped=_credential_headers(source))
    if (read_as := payloads.content_type_read(headers.get("content-type"), as_form)) is not None:
        headers["content-type"] = read_as  # what the workers read it as (payloads.py): what was read here
    if not headers_fit(headers):
        raise Rejected(error(431, "headers_too_large"))
    return EventMessage(
        key=event_id.idempotency_key(source.name, resolved_id),
        source=source.name,
        event_id=resolved_id,
        payload_sha256=payload_hash,
        received_at=time.time(),
        body=body,
        headers=headers,
        arrival=new_arrival(),
    ), unsigned_id


def _credential_headers(source: Source) -> frozenset[str]:
    """A secret the provider sends as it is (gitlab's token, an API key) is never handed on or stored."""
    header = getattr(source.verifier, "credential_header", None)
    return frozenset({header.lower()}) if header else frozenset()


def _event_id(
    source: Source, request: web.Request, payload: dict, payload_hash: str, verified: Verified
) -> tuple[str, bool]:
    """The event id, and whether it was read from a header the signature does not cover."""
    headers = (
        event_id.SignedHeaders(request.headers, verified.signed_headers) if verified.signed_headers else request.headers
    )
    resolved = event_id.resolve_with(source.event_id_selectors, headers, payload)
    if resolved is None:
        if not source.fallback_hash:
            raise Rejected(error(400, "missing_event_id"))
        return event_id.fallback_event_id(payload_hash), False
    resolved_id = utf8_text(resolved[0])  # from a header with bytes that are not UTF-8
    if len(resolved_id.encode()) > MAX_EVENT_ID_BYTES:
        raise Rejected(error(400, "invalid_event_id"))
    return resolved_id, event_id.reads_unsigned_header(resolved[1], verified.signed_headers)
