"""Who may see and change what in the console: sessions, sign-in, CSRF.

The session is a cookie encrypted and authenticated under a random key the
ingress processes share through Postgres, HttpOnly, SameSite=Strict, Secure
when the request came over HTTPS; it carries a random session id, and the
server decides from its own row whether the session is still good
(sessions.py): signing out ends it for every copy of the cookie, and so
does changing the token that signed it in. A session ends
`console_session_seconds` after sign-in, however busy it was.

Every POST carries the session's CSRF token (a form field, or the
`X-CSRF-Token` header htmx sends), and a cross-site `Origin` or
`Sec-Fetch-Site` refuses it too: 403 either way. Sign-in itself is a POST
with a token of the session the login page started.
"""

import hmac
import secrets
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import hdrs, web
from aiohttp_session import Session, get_session, new_session

from webhook_ingest.ingress.appkeys import settings_key
from webhook_ingest.ingress.client_address import forwarded_proto, is_within, parse_address
from webhook_ingest.ingress.tokens import OPERATOR, VIEWER
from webhook_ingest.shared.settings import Settings

from .sessions import SessionCookies, console_sessions_key

COOKIE_NAME = "webhook_ingest_console"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"
FORM = "application/x-www-form-urlencoded"
EXPIRED_NOTICE_SECONDS = 3600
role_key = web.RequestKey("console_role", str)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def came_over_https(request: web.Request) -> bool:
    """HTTPS to this process, or to a trusted proxy that says so in the
    header family it manages (`WEBHOOK_INGEST_CLIENT_ADDRESS_HEADER`): with
    `X-Forwarded-For`, `X-Forwarded-Proto`; with `Forwarded`, the `proto=`
    its outermost trusted proxy wrote. The other header is the client's."""
    if request.secure:
        return True
    peer_name = request.transport.get_extra_info("peername") if request.transport else None
    peer = parse_address(peer_name[0]) if peer_name else None
    settings = request.config_dict[settings_key]
    if not is_within(peer, settings.trusted_proxies):
        return False
    if settings.client_address_header == hdrs.FORWARDED:
        proto = forwarded_proto(peer, request.headers, settings.trusted_proxies)
    else:
        proto = request.headers.get("X-Forwarded-Proto", "").split(",")[0]
    return proto.strip().lower() == "https"


def cookie_storage(settings: Settings) -> SessionCookies:
    """The cookie outlives the session by an hour, so a person coming back
    is told their session expired; the server's row is what ends it."""
    return SessionCookies(
        came_over_https,
        cookie_name=COOKIE_NAME,
        path="/console/",
        httponly=True,
        samesite="Strict",
        max_age=settings.console_session_seconds + EXPIRED_NOTICE_SECONDS,
    )


async def sign_in(request: web.Request, role: str, token: str) -> None:
    """A fresh session (a new CSRF token: nothing from before sign-in survives)."""
    settings = request.config_dict[settings_key]
    session_id = await request.config_dict[console_sessions_key].begin(
        role, token, request.remote, settings.console_session_seconds
    )
    session = await new_session(request)
    session.update({"sid": session_id, "csrf": secrets.token_urlsafe(32)})


async def sign_out(request: web.Request) -> None:
    session = await get_session(request)
    if isinstance(session_id := session.get("sid"), str):
        await request.config_dict[console_sessions_key].end(session_id)
    session.invalidate()


async def session_role(request: web.Request) -> str | None:
    """The role of the request's session while the server holds it live and
    the token that signed it in is still configured; else None."""
    session = await get_session(request)
    if not isinstance(session_id := session.get("sid"), str):
        return None
    sessions = request.config_dict[console_sessions_key]
    live = await sessions.live(session_id)
    if live is None or live.role not in (OPERATOR, VIEWER):
        return None
    settings = request.config_dict[settings_key]
    token = settings.admin_token if live.role == OPERATOR else settings.viewer_token
    if not token or not hmac.compare_digest(live.token_fingerprint, await sessions.fingerprint(token)):
        return None
    return live.role


def had_session(session: Session) -> bool:
    """The cookie once held a sign-in (to say "your session expired")."""
    return "sid" in session


async def csrf_token(request: web.Request) -> str:
    """The session's CSRF token, made on first use (the login page's session)."""
    session = await get_session(request)
    if "csrf" not in session:
        # The cookie that will carry it needs the key kept in Postgres: asked
        # for here, Postgres away is the console's 503 page; asked for only when
        # the cookie is written (after every handler), it was a 500.
        await request.config_dict[console_sessions_key].fernet()
        session["csrf"] = secrets.token_urlsafe(32)
    return session["csrf"]


def same_origin(headers, host: str) -> bool:
    """False when the browser says the request came from another site."""
    fetch_site = headers.get("Sec-Fetch-Site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return False
    origin = headers.get("Origin")
    if origin is None:
        return True
    try:
        return origin != "null" and urlsplit(origin).netloc.lower() == host.lower()
    except ValueError:  # not a URL (`http://[::1`): no site of ours
        return False


def csrf_matches(presented: str | None, expected: str | None) -> bool:
    if not presented or not expected:
        return False
    # surrogateescape: a header's bytes that are not UTF-8, as aiohttp decoded them
    return hmac.compare_digest(presented.encode("utf-8", "surrogateescape"), expected.encode())


async def presented_csrf(request: web.Request) -> str | None:
    if CSRF_HEADER in request.headers:
        return request.headers[CSRF_HEADER]
    return await form_field(request, CSRF_FIELD)


async def form_field(request: web.Request, name: str) -> str | None:
    """A field of a console form, which is url-encoded UTF-8 as our pages send
    it; None for anything else (another charset, bytes that are not UTF-8, a
    multipart body), which aiohttp's parser raised out of the handler as a 500."""
    if request.content_type != FORM:
        return None
    try:
        value = (await request.post()).get(name)
    except (ValueError, LookupError):  # UnicodeDecodeError is a ValueError; LookupError: an unknown charset
        return None
    return value if isinstance(value, str) else None
