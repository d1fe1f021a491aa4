"""Who may see and change what in the console: sessions, sign-in, CSRF.

The session is an encrypted cookie (aiohttp-session's EncryptedCookieStorage,
Fernet: AES + HMAC), HttpOnly, SameSite=Strict, Secure when the request came
over HTTPS. Its key is *derived from the operator token* (HKDF-SHA256), not
random per process: several ingress processes share one port
(`--reuse-port`), and a sign-in served by one must be valid in the others.
Changing `WEBHOOK_INGEST_ADMIN_TOKEN` therefore ends every session; the
session also remembers which token signed it in, so changing the viewer
token ends the viewers' sessions. A session ends `console_session_seconds`
after sign-in, however busy it was.

Every POST carries the session's CSRF token (a form field, or the
`X-CSRF-Token` header htmx sends), and a cross-site `Origin` or
`Sec-Fetch-Site` refuses it too: 403 either way. Sign-in itself is a POST
with a token of the session the login page started.
"""

import functools
import hashlib
import hmac
import secrets
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web
from aiohttp_session import Session, get_session, new_session
from aiohttp_session.cookie_storage import EncryptedCookieStorage
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from webhook_ingest.ingress.appkeys import settings_key
from webhook_ingest.ingress.client_address import is_within, parse_address
from webhook_ingest.ingress.tokens import OPERATOR, VIEWER
from webhook_ingest.shared.settings import Settings

COOKIE_NAME = "webhook_ingest_console"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"
EXPIRED_NOTICE_SECONDS = 3600
role_key = web.RequestKey("console_role", str)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@functools.lru_cache(maxsize=4)
def session_key(admin_token: str) -> bytes:
    """32 bytes for Fernet, the same in every process that has the token."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                info=b"webhook-ingest console session v1").derive(admin_token.encode())


class CookieStorage(EncryptedCookieStorage):
    """Marks the cookie Secure when the request came over HTTPS."""

    async def save_session(self, request: web.Request, response: web.StreamResponse, session: Session) -> None:
        # No await between setting the flag and the parent writing the cookie.
        self._cookie_params["secure"] = came_over_https(request)
        await super().save_session(request, response, session)


def came_over_https(request: web.Request) -> bool:
    """HTTPS to this process, or to a trusted proxy that says so
    (`X-Forwarded-Proto` or `Forwarded: proto=`), as when a load balancer
    terminates TLS."""
    if request.secure:
        return True
    peer = request.transport.get_extra_info("peername") if request.transport else None
    trusted = request.config_dict[settings_key].trusted_proxies
    if not peer or not is_within(parse_address(peer[0]), trusted):
        return False
    forwarded = [element.get("proto") for element in request.forwarded][:1]
    proto = forwarded[0] if forwarded else request.headers.get("X-Forwarded-Proto", "").split(",")[0]
    return (proto or "").strip().lower() == "https"


def cookie_storage(settings: Settings) -> CookieStorage:
    """The cookie outlives the session by an hour, so a person coming back
    is told their session expired; the session's own `expires_at` (inside
    the encrypted cookie, so it cannot be changed) is what ends it."""
    return CookieStorage(session_key(settings.admin_token), cookie_name=COOKIE_NAME, path="/console/",
                         httponly=True, samesite="Strict",
                         max_age=settings.console_session_seconds + EXPIRED_NOTICE_SECONDS)


def token_fingerprint(token: str, settings: Settings) -> str:
    """Which token signed a session in, without keeping the token in it."""
    return hmac.new(session_key(settings.admin_token), token.encode(), hashlib.sha256).hexdigest()[:32]


async def sign_in(request: web.Request, role: str, token: str) -> None:
    """A fresh session (a new CSRF token: nothing from before sign-in survives)."""
    settings = request.config_dict[settings_key]
    session = await new_session(request)
    session.update({"role": role, "token": token_fingerprint(token, settings), "csrf": secrets.token_urlsafe(32),
                    "expires_at": time.time() + settings.console_session_seconds})


async def sign_out(request: web.Request) -> None:
    (await get_session(request)).invalidate()


def session_role(session: Session, settings: Settings) -> str | None:
    """The role of a signed-in, unexpired session whose token is still configured."""
    role = session.get("role")
    if role not in (OPERATOR, VIEWER) or time.time() >= session.get("expires_at", 0):
        return None
    token = settings.admin_token if role == OPERATOR else settings.viewer_token
    if not token or not hmac.compare_digest(session.get("token", ""), token_fingerprint(token, settings)):
        return None
    return role


async def csrf_token(request: web.Request) -> str:
    """The session's CSRF token, made on first use (the login page's session)."""
    session = await get_session(request)
    if "csrf" not in session:
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
    return origin != "null" and urlsplit(origin).netloc.lower() == host.lower()


def csrf_matches(presented: str | None, expected: str | None) -> bool:
    if not presented or not expected:
        return False
    return hmac.compare_digest(presented.encode(), expected.encode())


async def presented_csrf(request: web.Request) -> str | None:
    if CSRF_HEADER in request.headers:
        return request.headers[CSRF_HEADER]
    if request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        value = (await request.post()).get(CSRF_FIELD)
        return value if isinstance(value, str) else None
    return None
