"""What every console request goes through, in this order: the bounds
the webhooks have (a slot, a form body of bounded size read within the body
time limit), the session, the security headers, sign-in, CSRF and role
checks, then the page; the failures a page can expect become a page with a
clear message, never a 500.
"""

from aiohttp import web
from aiohttp_session import get_session

from webhook_ingest.ingress.intake import read_form_within, slots_key
from webhook_ingest.ingress.responses import Rejected
from webhook_ingest.ingress.tokens import may_change
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.observability import get_logger
from webhook_ingest.shared.service_errors import POSTGRES_ERRORS

from .rendering import message_page
from .security import (
    Handler,
    csrf_matches,
    had_session,
    presented_csrf,
    role_key,
    same_origin,
    session_role,
)

log = get_logger(__name__)

PUBLIC_PREFIXES = ("/console/login", "/console/static/")
MAX_FORM_BYTES = 64 * 1024  # the largest console form (a bulk action's filter) is a few hundred bytes
ANYONE_MAY_POST = ("/console/login", "/console/logout")
# Nothing from another host, no inline script; the page works without script at all.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


@web.middleware
async def bounded(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A slot of the process's and of the client's, as a webhook takes
    (ingress/intake/slots.py), and a POST's form read whole before anything else
    looks at it (limits.read_form_within): the sign-in page is as public as
    the webhooks and must not let a slow client hold the process."""
    try:
        with request.config_dict[slots_key].taken(request.remote) as slot:
            if request.method == "POST":
                await read_form_within(request, slot, MAX_FORM_BYTES)
            slot.body_arrived()
            return await handler(request)
    except Rejected as rejection:
        return rejection.response


@web.middleware
async def security_headers(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        _protect(exc)
        raise
    return _protect(response)


def _protect(response: web.StreamResponse) -> web.StreamResponse:
    response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")
    response.headers.setdefault("Cache-Control", "no-store")
    return response


@web.middleware
async def signed_in(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Pages need a session; without one, GET goes to the sign-in page."""
    if request.path.startswith(PUBLIC_PREFIXES):
        return await handler(request)
    role = await session_role(request)
    if role is None:
        session = await get_session(request)
        expired = had_session(session)
        session.invalidate()
        login = "/console/login" + ("?expired=1" if expired else "")
        if request.headers.get("HX-Request"):  # a refresh in place: the whole page goes to sign-in
            return web.Response(status=204, headers={"HX-Redirect": login})
        if request.method in ("GET", "HEAD"):
            raise web.HTTPSeeOther(login)
        return await message_page(request, 403, "Sign in first", "Your session has ended. Sign in again.")
    request[role_key] = role
    return await handler(request)


@web.middleware
async def csrf_protected(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every POST: same origin, the session's CSRF token, and (but for
    sign-in and sign-out) the operator's role."""
    if request.method in ("GET", "HEAD", "OPTIONS"):
        return await handler(request)
    if not same_origin(request.headers, request.host):
        return await message_page(request, 403, "Refused", "This request came from another site.")
    session = await get_session(request)
    if not csrf_matches(await presented_csrf(request), session.get("csrf")):
        return await message_page(
            request,
            403,
            "Refused",
            "The form was missing its security token or it was out of date. Reload the page and try again.",
        )
    if not request.path.startswith(ANYONE_MAY_POST) and not may_change(request.get(role_key)):
        return await message_page(
            request, 403, "Read only", "The viewer token may look at everything but change nothing."
        )
    return await handler(request)


@web.middleware
async def expected_failures(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return await message_page(request, 404, "Not found", "There is no such page.")
    except POSTGRES_ERRORS as exc:
        log.warning("console_database_unavailable", error=describe(exc))
        return await message_page(
            request,
            503,
            "PostgreSQL is unreachable",
            "The console reads everything from PostgreSQL. Try again in a moment.",
            headers={"Retry-After": "5"},
            without_session=True,
        )
