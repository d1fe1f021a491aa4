"""The console's pages (docs/reference.md §8.1). Every GET renders a whole page that
works without JavaScript; every POST redirects (post/redirect/get) with a
message for the next page. Bad input — an unknown id, a garbled filter, a
dead letter someone else handled meanwhile — is a message, never a 500."""

import math

from aiohttp import web

from webhook_ingest.ingress import signature_headers
from webhook_ingest.ingress.admin import dead_letters_key
from webhook_ingest.ingress.appkeys import database_pool_key, settings_key, sources_key
from webhook_ingest.ingress.archive import arrivals_key
from webhook_ingest.ingress.intake import sign_in_throttle_key
from webhook_ingest.ingress.publishing import publisher_key
from webhook_ingest.ingress.tokens import may_change, role_of
from webhook_ingest.shared.audit import Actor
from webhook_ingest.shared.dead_letters import (
    STATUSES,
    ChangedMeanwhile,
    DeadLetterNotFound,
    DeadLetterStore,
    NotReplayable,
    ReplayInterrupted,
    describe_error,
    detail,
    parse_id,
)
from webhook_ingest.shared.dead_letters import bulk as bulk_actions
from webhook_ingest.shared.incidents import IncidentStore
from webhook_ingest.shared.observability import get_logger
from webhook_ingest.shared.runs import RunBusy
from webhook_ingest.shared.worker_heartbeats import HeartbeatStore

from .bulk import DEFAULT_RATE, MAX_RATE, BulkRunner
from .events import json_text
from .filters import form_values, parse_before, parse_filter, query_string
from .incidents import LISTED
from .ordering import blocked_figures
from .overview import overview
from .rendering import leave_message, message_page, render
from .security import form_field, role_key, session_role, sign_in, sign_out

log = get_logger(__name__)
PAGE_SIZE = 50
bulk_runner_key = web.AppKey("bulk_runner", BulkRunner)
routes = web.RouteTableDef()  # each page's method and path stand above its handler


def add_routes(console: web.Application) -> None:
    console.router.add_routes(routes)


def store(request: web.Request) -> DeadLetterStore:
    return request.config_dict[dead_letters_key]


def actor(request: web.Request) -> Actor:
    return Actor(request[role_key], "console")


# -- signing in ------------------------------------------------------------------


@routes.get("/login")
async def login_page(request: web.Request) -> web.Response:
    if await session_role(request):
        raise web.HTTPSeeOther("/console/")
    notice = "Your session expired. Sign in again." if request.query.get("expired") else None
    return await render(request, "login.html", {"error": None, "notice": notice})


@routes.post("/login")
async def login(request: web.Request) -> web.Response:
    """Throttled per client address before the token is even looked at
    (ingress/intake/limits.py: a few at once, then a few a minute)."""
    wait = await request.config_dict[sign_in_throttle_key].retry_after(request.remote)
    if wait > 0:
        seconds = math.ceil(wait)
        return await render(
            request,
            "login.html",
            {"notice": None, "error": f"Too many sign-in attempts from your address. Try again in {seconds} seconds."},
            status=429,
            headers={"Retry-After": str(seconds)},
        )
    token = await form_field(request, "token") or ""
    role = role_of(token, request.config_dict[settings_key]) if token else None
    if role is None:
        log.warning("console_sign_in_refused", client=request.remote)
        return await render(request, "login.html", {"error": "That token is not valid.", "notice": None}, status=401)
    log.info("console_signed_in", role=role, client=request.remote)
    await sign_in(request, role, token)
    raise web.HTTPSeeOther("/console/")


@routes.post("/logout")
async def logout(request: web.Request) -> web.Response:
    await sign_out(request)
    raise web.HTTPSeeOther("/console/login")


# -- reading ---------------------------------------------------------------------


@routes.get("/")
async def overview_page(request: web.Request) -> web.Response:
    settings = request.config_dict[settings_key]
    arrivals = request.config_dict.get(arrivals_key)
    figures = await overview(
        store(request),
        HeartbeatStore(request.config_dict[database_pool_key]),
        settings.amqp_url,
        settings.namespace,
        request.config_dict[sources_key],
        arrivals.archive_sizes() if arrivals else {},
        blocked_figures(request.config_dict[database_pool_key]),
    )
    if request.headers.get("HX-Request"):
        return await render(request, "overview_figures.html", {"overview": figures})
    incidents = IncidentStore(request.config_dict[database_pool_key])
    unresolved = [*await incidents.newest_first("open", LISTED), *await incidents.newest_first("acknowledged", LISTED)]
    return await render(request, "overview.html", {"overview": figures, "incidents": unresolved})


@routes.get("/dead-letters")
async def dead_letters_page(request: web.Request) -> web.Response:
    where, problems = parse_filter(request.query)
    before, cursor_problems = parse_before(request.query)
    sources, error_types = await store(request).filter_choices()
    rows = [] if problems else await store(request).search(where, before, PAGE_SIZE + 1)
    values = form_values(request.query)
    older = query_string(values, before=str(rows[PAGE_SIZE - 1]["id"])) if len(rows) > PAGE_SIZE else None
    context = {
        "rows": [_row_view(row) for row in rows[:PAGE_SIZE]],
        "problems": problems + cursor_problems,
        "values": values,
        "sources": sources,
        "error_types": error_types,
        "statuses": [*STATUSES, "all"],
        "older": older,
        "newest": query_string(values) if before else None,
        "bulk_allowed": not problems,
    }
    return await render(request, "dead_letters.html", context, status=400 if problems else 200)


def _row_view(row: dict) -> dict:
    return row | {"last_error_text": describe_error(row["last_error"]) or "—"}


@routes.get("/dead-letters/{id}")
async def dead_letter_page(request: web.Request) -> web.Response:
    if signature_headers.asked(request) and not may_change(request.get(role_key)):
        return await message_page(
            request,
            403,
            "Signature headers are the operator's",
            "With its body, a signature header is the request itself: the viewer token sees every other header.",
        )
    dead_letter_id = parse_id(request.match_info["id"])
    if dead_letter_id is None:
        return await message_page(
            request, 400, "Not a dead-letter id", "Dead-letter ids are positive whole numbers, as in the list."
        )
    row = await store(request).get(dead_letter_id)
    if row is None:
        return await message_page(
            request, 404, "No such dead letter", f"There is no dead letter with id {dead_letter_id}."
        )
    history = await store(request).replays_of(dead_letter_id)
    ordering_block = await store(request).ordering_block(dead_letter_id)
    audit = await store(request).audit_log.entries(dead_letter_id=dead_letter_id, limit=50)
    document = detail(row)
    headers = signature_headers.hide(document["headers"], signature_headers.hidden_names(request))
    return await render(
        request,
        "dead_letter.html",
        {
            "letter": document,
            "payload_text": _pretty(document),
            "headers": sorted(headers.items()),
            "signatures_shown": signature_headers.asked(request),
            "errors": row["errors"],
            "replays": history,
            "audit": audit,
            "ordering_block": ordering_block,
        },
    )


def _pretty(document: dict) -> str:
    if document["payload"] is None:
        return document.get("body", "")
    return json_text(document["payload"])


@routes.get("/audit")
async def audit_page(request: web.Request) -> web.Response:
    before, problems = parse_before(request.query)
    entries = await store(request).audit_log.entries(before=before, limit=PAGE_SIZE + 1)
    older = str(entries[PAGE_SIZE - 1]["id"]) if len(entries) > PAGE_SIZE else None
    return await render(request, "audit.html", {"entries": entries[:PAGE_SIZE], "older": older, "problems": problems})


# -- acting on one ---------------------------------------------------------------


@routes.post("/dead-letters/{id}/replay")
async def replay_one(request: web.Request) -> web.Response:
    dead_letter_id = _id_or_404(request)
    publisher = request.config_dict[publisher_key]
    channel = publisher.channel
    if not publisher.ready or channel is None:
        return await _back_to(
            request,
            dead_letter_id,
            "error",
            "RabbitMQ is unreachable: nothing was replayed. Try again once it is back.",
        )
    namespace = request.config_dict[settings_key].namespace
    try:
        await store(request).replay_if_open(channel, namespace, dead_letter_id, actor(request))
    except ReplayInterrupted:
        return await _back_to(request, dead_letter_id, "error", "RabbitMQ did not confirm: nothing was replayed.")
    except (ChangedMeanwhile, NotReplayable, DeadLetterNotFound) as exc:
        return await _back_to(request, dead_letter_id, "error", _sentence(exc))
    return await _back_to(request, dead_letter_id, "ok", f"Dead letter {dead_letter_id} replayed.")


@routes.post("/dead-letters/{id}/discard")
async def discard_one(request: web.Request) -> web.Response:
    dead_letter_id = _id_or_404(request)
    try:
        await store(request).discard_if_open(dead_letter_id, actor(request))
    except (ChangedMeanwhile, DeadLetterNotFound) as exc:
        return await _back_to(request, dead_letter_id, "error", _sentence(exc))
    return await _back_to(request, dead_letter_id, "ok", f"Dead letter {dead_letter_id} discarded.")


def _id_or_404(request: web.Request) -> int:
    dead_letter_id = parse_id(request.match_info["id"])
    if dead_letter_id is None:
        raise web.HTTPNotFound()
    return dead_letter_id


def _sentence(exc: Exception) -> str:
    text = str(exc)
    return text[:1].upper() + text[1:] + "."


async def _back_to(request: web.Request, dead_letter_id: int, kind: str, text: str) -> web.Response:
    await leave_message(request, kind, text)
    raise web.HTTPSeeOther(f"/console/dead-letters/{dead_letter_id}")


# -- acting on all that match ------------------------------------------------------


@routes.post("/bulk")
async def prepare_bulk(request: web.Request) -> web.Response:
    """Freeze the open dead letters the filter matches now; ask to confirm."""
    form = {name: value for name, value in (await request.post()).items() if isinstance(value, str)}
    action = form.get("action")
    where, problems = parse_filter(form)
    if action not in bulk_actions.ACTIONS or problems:
        return await message_page(request, 400, "Nothing was done", " ".join(problems) or "Unknown action.")
    ids = await store(request).matching_open_ids(where)
    if not ids:
        await leave_message(request, "error", "No open dead letters match this filter: nothing to do.")
        raise web.HTTPSeeOther("/console/dead-letters?" + query_string(form_values(form)))
    bulk_action_id = await store(request).prepare_bulk(action, ids, where.as_json(), actor(request))
    raise web.HTTPSeeOther(f"/console/bulk/{bulk_action_id}")


@routes.get("/bulk/{id}")
async def bulk_page(request: web.Request) -> web.Response:
    bulk_action_id = _id_or_404(request)
    action = await store(request).bulk_action(bulk_action_id)
    if action is None:
        return await message_page(request, 404, "No such bulk action", f"There is no bulk action {bulk_action_id}.")
    template = "bulk_progress.html" if request.headers.get("HX-Request") else "bulk.html"
    return await render(
        request,
        template,
        {
            "action": action,
            "default_rate": DEFAULT_RATE,
            "max_rate": MAX_RATE,
            "filter_text": _describe_filter(action.filter),
        },
    )


def _describe_filter(saved: dict) -> str:
    if "incident" in saved:
        return f"the open dead letters of incident {saved['incident']}"
    names = {"source": "source", "error_type": "error type", "since": "from", "until": "until", "text": "text"}
    parts = [f"{label} {saved[name]!r}" for name, label in names.items() if saved.get(name)]
    return ", ".join(parts) or "no filter: every open dead letter"


@routes.post("/bulk/{id}/start")
async def start_bulk(request: web.Request) -> web.Response:
    bulk_action_id = _id_or_404(request)
    rate = _rate((await request.post()).get("rate"))
    if rate is None:
        await leave_message(request, "error", f"The rate must be a number above 0 and at most {MAX_RATE:g} per second.")
        raise web.HTTPSeeOther(f"/console/bulk/{bulk_action_id}")
    action = await store(request).claim_bulk(bulk_action_id, rate)
    if action is None:
        await leave_message(request, "error", "This bulk action is not waiting to start: nothing was changed.")
    else:
        request.config_dict[bulk_runner_key].start_bulk(
            action,
            actor(request),
            store(request),
            request.config_dict[publisher_key],
            request.config_dict[settings_key].namespace,
        )
    raise web.HTTPSeeOther(f"/console/bulk/{bulk_action_id}")


def _rate(raw) -> float | None:
    try:
        rate = float(raw)
    except (TypeError, ValueError):
        return None
    return rate if 0 < rate <= MAX_RATE else None


@routes.post("/bulk/{id}/cancel")
async def cancel_bulk(request: web.Request) -> web.Response:
    bulk_action_id = _id_or_404(request)
    try:
        cancelled = await store(request).cancel_bulk(bulk_action_id, actor(request))
    except RunBusy as busy:
        await leave_message(request, "error", str(busy))
        raise web.HTTPSeeOther(f"/console/bulk/{bulk_action_id}") from None
    await leave_message(
        request,
        "ok" if cancelled else "error",
        "Cancelled: what was done stays done." if cancelled else "This bulk action had already ended.",
    )
    raise web.HTTPSeeOther(f"/console/bulk/{bulk_action_id}")
