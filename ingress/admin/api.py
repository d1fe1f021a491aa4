"""The admin HTTP API on the ingress (docs/reference.md §8): dead letters for on-call.

    GET  /admin/dead-letters?source=&status=&limit=
    GET  /admin/dead-letters/{id}
    POST /admin/dead-letters/{id}/replay
    POST /admin/dead-letters/{id}/discard

(and the routes of events, replays, incidents, sources, workers and
ordering keys, each in its module)

A sub-application mounted at `/admin/` only when `WEBHOOK_INGEST_ADMIN_TOKEN`
is set (unset: the routes do not exist, 404). Its middleware does what every
route needs: the bearer token first (`Authorization: Bearer TOKEN`, else
401, and a client with too many wrong ones 429; the viewer token may GET
and gets 403 on a POST), then the expected
failures as JSON answers. The documents are the CLI's
(`shared.dead_letters.model.summary` / `detail`); replay and discard answer with
the dead letter's summary after the change, and are written to the audit log.
No CSRF token here: a bearer header is never sent by a browser on its own.

The dead-letter store over the process's Postgres pool (and the
`webhook_dead_letters_open` gauge it keeps fresh) belongs to the main
application, whether or not the API is enabled: the gauge is part of the
ingress's metrics, and the console uses the store too. The pool starts
empty, so the ingress serves webhooks while Postgres is down.
"""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from aiohttp import web

from webhook_ingest.ingress import signature_headers
from webhook_ingest.ingress.appkeys import database_pool_key, settings_key
from webhook_ingest.ingress.intake import failure_budget_key
from webhook_ingest.ingress.publishing import publisher_key
from webhook_ingest.ingress.responses import Rejected, error
from webhook_ingest.ingress.tokens import may_change, role_of
from webhook_ingest.shared.archive import InvalidFilter, parse_text
from webhook_ingest.shared.audit import Actor
from webhook_ingest.shared.dead_letters import (
    STATUSES,
    DeadLetterNotFound,
    DeadLetterStore,
    NotReplayable,
    ReplayInterrupted,
    detail,
    parse_id,
    summary,
    wake_lanes,
)
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.observability import get_logger
from webhook_ingest.shared.service_errors import POSTGRES_ERRORS
from webhook_ingest.shared.settings import Settings

from .common import BadId, dead_letters_key, json_document, parse_path_id, role_key
from .event_replays import add_event_replay_routes, setup_event_replays
from .events import add_event_routes
from .incidents import add_incident_routes
from .ordering import add_ordering_routes, ordering_gauges_ctx
from .sources import add_source_routes
from .workers import add_worker_routes

log = get_logger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def setup_admin(app: web.Application, settings: Settings) -> None:
    app.cleanup_ctx.append(admin_ctx)
    app.cleanup_ctx.append(ordering_gauges_ctx)
    setup_event_replays(app)
    if settings.admin_token:
        app.add_subapp("/admin/", admin_app())


def admin_app() -> web.Application:
    admin = web.Application(middlewares=[bearer_token, expected_failures])
    admin.router.add_get("/dead-letters", list_route)
    admin.router.add_get("/dead-letters/{id}", show_route)
    admin.router.add_post("/dead-letters/{id}/replay", replay_route)
    admin.router.add_post("/dead-letters/{id}/discard", discard_route)
    add_event_replay_routes(admin)  # before add_event_routes: its /events/{key} would take /events/replay/7
    add_event_routes(admin)
    add_incident_routes(admin)
    add_source_routes(admin)
    add_worker_routes(admin)
    add_ordering_routes(admin)
    return admin


async def admin_ctx(app: web.Application) -> AsyncIterator[None]:
    async def wake(lanes: Sequence[str]) -> None:  # ordering lanes a discard freed (docs/design.md, "Ordering keys")
        publisher = app[publisher_key]
        await wake_lanes(publisher.channel if publisher.ready else None, app[settings_key].namespace, lanes)

    store = DeadLetterStore(app[database_pool_key], wake)  # the process's one pool (ingress/database.py owns it)
    app[dead_letters_key] = store
    gauge = asyncio.create_task(store.keep_open_gauge(), name="dead-letters-gauge")
    yield
    gauge.cancel()
    await asyncio.gather(gauge, return_exceptions=True)


# -- routes ------------------------------------------------------------------------


async def list_route(request: web.Request) -> web.Response:
    status = request.query.get("status") or "dead"
    limit = request.query.get("limit")
    if status not in (*STATUSES, "all"):
        return error(400, "invalid_status")
    if limit is not None and not parse_id(limit):
        return error(400, "invalid_limit")
    source = request.query.get("source") or None
    try:
        parse_text("source", source)  # a NUL: Postgres would refuse the query, which is no outage
    except InvalidFilter:
        return error(400, "invalid_source")
    rows = await _store(request).newest_first(source, status, int(limit) if limit else None)
    return json_document(200, [summary(row) for row in rows])


async def show_route(request: web.Request) -> web.Response:
    if signature_headers.asked(request) and not may_change(request[role_key]):
        return error(403, "forbidden")
    row = await _store(request).get(parse_path_id(request))
    if row is None:
        return error(404, "not_found")
    document = detail(row)
    document["headers"] = signature_headers.hide(document["headers"], signature_headers.hidden_names(request))
    return json_document(200, document)


async def replay_route(request: web.Request) -> web.Response:
    dead_letter_id = parse_path_id(request)
    publisher = request.config_dict[publisher_key]
    channel = publisher.channel
    if not publisher.ready or channel is None:
        return error(503, "broker_unavailable", {"Retry-After": "5"})
    try:
        done = await _store(request).replay(
            channel, request.config_dict[settings_key].namespace, ids=[dead_letter_id], actor=_actor(request)
        )
    except ReplayInterrupted as exc:
        log.warning("dead_letter_replay_failed", dead_letter_id=dead_letter_id, error=str(exc))
        return error(503, "broker_unavailable", {"Retry-After": "5"})
    if done.skipped:  # another replay or a discard got there first
        return error(409, "changed_meanwhile")
    return await _summary_of(request, dead_letter_id)


async def discard_route(request: web.Request) -> web.Response:
    dead_letter_id = parse_path_id(request)
    await _store(request).discard([dead_letter_id], _actor(request))
    return await _summary_of(request, dead_letter_id)


# -- the pieces every route shares -------------------------------------------------


@web.middleware
async def bearer_token(request: web.Request, handler: Handler) -> web.StreamResponse:
    """401 without a token of ours, which spends the client's failure budget
    as a webhook failing verification does (ingress/intake/failure_budget.py); a
    client with none left gets 429 before its token is looked at. 403 for
    the viewer's POST."""
    budget = request.config_dict[failure_budget_key]
    try:
        budget.refuse_if_spent(request.remote)
    except Rejected as rejection:
        return rejection.response
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    role = role_of(presented.strip(), request.config_dict[settings_key]) if scheme.lower() == "bearer" else None
    if role is None:
        budget.charge(request.remote)
        log.warning("admin_token_refused", client=request.remote)
        return error(401, "unauthorized", {"WWW-Authenticate": "Bearer"})
    if request.method not in ("GET", "HEAD") and not may_change(role):
        return error(403, "forbidden")
    request[role_key] = role
    return await handler(request)


@web.middleware
async def expected_failures(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except BadId:
        return error(400, "invalid_id")
    except DeadLetterNotFound:
        return error(404, "not_found")
    except NotReplayable:
        return error(409, "not_replayable")
    except POSTGRES_ERRORS as exc:
        log.warning("admin_database_unavailable", error=describe(exc))
        return error(503, "database_unavailable", {"Retry-After": "5"})


def _actor(request: web.Request) -> Actor:
    return Actor(request[role_key], "admin-api")


def _store(request: web.Request) -> DeadLetterStore:
    return request.config_dict[dead_letters_key]


async def _summary_of(request: web.Request, dead_letter_id: int) -> web.Response:
    row = await _store(request).get(dead_letter_id)
    assert row is not None, "just replayed or discarded, and dead letters are never deleted"
    return json_document(200, summary(row))
