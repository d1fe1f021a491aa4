"""The console's sessions, kept by the server (docs/security.md, "Console sessions").

The cookie is encrypted and authenticated (Fernet) under a random key kept
in Postgres (`console_session_key`), made by the first ingress process that
needs it: every process behind one port reads the same key, and nothing
about it follows from the operator token, so no cookie confirms a guess of
the token. The cookie carries a random session id; the server keeps the
id's SHA-256, the role, and an HMAC of the token that signed it in
(`console_sessions`). A session is good only while its row says so:
signing out ends every copy of the cookie, and so does rotating the token.

The cookie storage is ours rather than aiohttp-session's
EncryptedCookieStorage because that one takes its key when it is built,
before the Postgres pool exists; ours asks for it on the first request.
"""

import base64
import hashlib
import hmac
import json
import secrets
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager as AsyncContextManager
from dataclasses import dataclass

import asyncpg
from aiohttp import web
from aiohttp_session import AbstractStorage, Session
from cryptography.fernet import Fernet, InvalidToken

from webhook_ingest.shared.db import load_queries, pooled

QUERIES = load_queries("webhook_ingest.ingress")
STATEMENT_SECONDS = 5.0


@dataclass(frozen=True)
class LiveSession:
    role: str
    token_fingerprint: bytes


class ConsoleSessions:
    """The key and the session rows, over the ingress's Postgres pool."""

    def __init__(self, pool: asyncpg.Pool | None, key: bytes | None = None):
        self._pool = pool
        self._key = key  # given: a test's; None: read from Postgres when first needed
        self._fernet: Fernet | None = None

    async def key(self) -> bytes:
        """The cookies' key, read once per process (made by the first process)."""
        if self._key is None:
            async with self._connection() as connection:
                await connection.execute(
                    QUERIES["create_console_session_key"], secrets.token_bytes(32), timeout=STATEMENT_SECONDS
                )
                self._key = bytes(await connection.fetchval(QUERIES["console_session_key"], timeout=STATEMENT_SECONDS))
        return self._key

    async def fernet(self) -> Fernet:
        if self._fernet is None:
            self._fernet = Fernet(base64.urlsafe_b64encode(await self.key()))
        return self._fernet

    async def fingerprint(self, token: str) -> bytes:
        """Which token signed a session in, without keeping the token."""
        return hmac.new(await self.key(), token.encode(), hashlib.sha256).digest()

    async def begin(self, role: str, token: str, client: str | None, seconds: int) -> str:
        """A new session's id, for the cookie."""
        session_id = secrets.token_urlsafe(32)
        fingerprint = await self.fingerprint(token)
        async with self._connection() as connection:
            await connection.execute(QUERIES["forget_old_console_sessions"], timeout=STATEMENT_SECONDS)
            await connection.execute(
                QUERIES["begin_console_session"],
                _digest(session_id),
                role,
                fingerprint,
                client,
                float(seconds),
                timeout=STATEMENT_SECONDS,
            )
        return session_id

    async def live(self, session_id: str) -> LiveSession | None:
        async with self._connection() as connection:
            row = await connection.fetchrow(
                QUERIES["live_console_session"], _digest(session_id), timeout=STATEMENT_SECONDS
            )
        return LiveSession(row["role"], bytes(row["token_fingerprint"])) if row else None

    def _connection(self) -> AsyncContextManager[asyncpg.Connection]:
        if self._pool is None:
            raise RuntimeError("this ConsoleSessions was given its key and has no pool")
        return pooled(self._pool, STATEMENT_SECONDS)

    async def end(self, session_id: str) -> None:
        async with self._connection() as connection:
            await connection.execute(QUERIES["end_console_session"], _digest(session_id), timeout=STATEMENT_SECONDS)


def _digest(session_id: str) -> bytes:
    return hashlib.sha256(session_id.encode()).digest()


console_sessions_key = web.AppKey("console_sessions", ConsoleSessions)


class SessionCookies(AbstractStorage):
    """aiohttp-session's storage: a Fernet cookie under the key in Postgres,
    Secure when `secure_for(request)` says the request came over HTTPS."""

    def __init__(self, secure_for: Callable[[web.Request], bool], **cookie_params) -> None:
        super().__init__(**cookie_params)
        self._secure_for = secure_for

    async def load_session(self, request: web.Request) -> Session:
        cookie = self.load_cookie(request)
        if cookie is not None:
            try:
                plain = (await _fernet(request)).decrypt(cookie.encode(), ttl=self.max_age)
                return Session(None, data=json.loads(plain), new=False, max_age=self.max_age)
            except (InvalidToken, ValueError):  # another key's, or garbage: a fresh session
                pass
        return Session(None, data=None, new=True, max_age=self.max_age)

    async def save_session(self, request: web.Request, response: web.StreamResponse, session: Session) -> None:
        if session.empty:
            return self.save_cookie(response, "", max_age=session.max_age)
        sealed = (await _fernet(request)).encrypt(json.dumps(self._get_session_data(session)).encode())
        # No await between setting the flag and writing the cookie: the storage serves every request.
        self._cookie_params["secure"] = self._secure_for(request)
        self.save_cookie(response, sealed.decode(), max_age=session.max_age)


async def _fernet(request: web.Request) -> Fernet:
    return await request.config_dict[console_sessions_key].fernet()
