"""The admin HTTP API on the ingress (docs/reference.md §8): dead letters for on-call.

    GET  /admin/dead-letters?source=&status=&limit=
    GET  /admin/dead-letters/{id}
    POST /admin/dead-letters/{id}/replay
    POST /admin/dead-letters/{id}/discard

Only when `WEBHOOK_INGEST_ADMIN_TOKEN` is set (`Authorization: Bearer
TOKEN`, else 401); unset, the routes do not exist (404). The documents are
the CLI's (`shared.dead_letters.summary` / `detail`); replay and discard
answer with the dead letter's summary after the change.

The Postgres pool (and the `webhook_dead_letters_open` gauge it keeps fresh)
exists whether or not the API is enabled: the gauge is part of the ingress's
metrics. The pool starts empty, so the ingress serves webhooks while
Postgres is down.
"""

import asyncio
import contextlib
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
from aiohttp import web

from webhook_ingest.ingress.appkeys import publisher_key, settings_key
from webhook_ingest.ingress.responses import error
from webhook_ingest.shared import metrics
from webhook_ingest.shared.dead_letters import (
    STATUSES,
    DeadLetterNotFound,
    NotReplayable,
    ReplayInterrupted,
    count_open,
    detail,
    discard,
    get_dead_letter,
    list_dead_letters,
    parse_id,
    replay,
    summary,
    to_json,
)
from webhook_ingest.shared.logging import get_logger
from webhook_ingest.shared.settings import Settings

log = get_logger(__name__)

admin_pool_key = web.AppKey("admin_pool", asyncpg.Pool)
GAUGE_REFRESH_SECONDS = 15.0
ACQUIRE_TIMEOUT = 5.0
POOL_CLOSE_TIMEOUT = 10.0
_DATABASE_ERRORS = (OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)

Handler = Callable[[web.Request], Awaitable[web.Response]]


def setup_admin(app: web.Application, settings: Settings) -> None:
    app.cleanup_ctx.append(admin_ctx)
    if not settings.admin_token:
        return
    app.router.add_get("/admin/dead-letters", _admin_route(list_route))
    app.router.add_get("/admin/dead-letters/{id}", _admin_route(show_route))
    app.router.add_post("/admin/dead-letters/{id}/replay", _admin_route(replay_route))
    app.router.add_post("/admin/dead-letters/{id}/discard", _admin_route(discard_route))


async def admin_ctx(app: web.Application) -> AsyncIterator[None]:
    pool = await asyncpg.create_pool(app[settings_key].database_url, min_size=0, max_size=4)
    app[admin_pool_key] = pool
    gauge = asyncio.create_task(refresh_dead_letters_gauge(pool), name="dead-letters-gauge")
    yield
    gauge.cancel()
    await asyncio.gather(gauge, return_exceptions=True)
    try:
        await asyncio.wait_for(pool.close(), POOL_CLOSE_TIMEOUT)
    except asyncio.TimeoutError:
        pool.terminate()


async def refresh_dead_letters_gauge(pool: asyncpg.Pool, every: float = GAUGE_REFRESH_SECONDS) -> None:
    """Forever: the gauge follows the table; a Postgres outage is logged and waited out."""
    while True:
        try:
            async with pool.acquire(timeout=ACQUIRE_TIMEOUT) as connection:
                metrics.dead_letters_open.set(await count_open(connection))
        except Exception as exc:  # noqa: BLE001 - a stale gauge, never a dead task
            log.warning("dead_letters_gauge_stale", error=f"{type(exc).__name__}: {exc}")
        await asyncio.sleep(every)


# -- routes ------------------------------------------------------------------------


async def list_route(request: web.Request) -> web.Response:
    status = request.query.get("status") or "dead"
    limit = request.query.get("limit")
    if status not in (*STATUSES, "all"):
        return error(400, "invalid_status")
    if limit is not None and not parse_id(limit):
        return error(400, "invalid_limit")
    async with _connection(request) as connection:
        rows = await list_dead_letters(connection, request.query.get("source") or None, status,
                                       int(limit) if limit else None)
    return _json(200, [summary(row) for row in rows])


async def show_route(request: web.Request) -> web.Response:
    async with _connection(request) as connection:
        row = await get_dead_letter(connection, _dead_letter_id(request))
    return error(404, "not_found") if row is None else _json(200, detail(row))


async def replay_route(request: web.Request) -> web.Response:
    dead_letter_id = _dead_letter_id(request)
    publisher = request.app[publisher_key]
    if not publisher.ready:
        return error(503, "broker_unavailable", {"Retry-After": "5"})
    async with _connection(request) as connection:
        try:
            await replay(connection, publisher.channel, request.app[settings_key].namespace, ids=[dead_letter_id])
        except ReplayInterrupted as exc:
            log.warning("dead_letter_replay_failed", dead_letter_id=dead_letter_id, error=str(exc))
            return error(503, "broker_unavailable", {"Retry-After": "5"})
        return await _summary_of(connection, dead_letter_id)


async def discard_route(request: web.Request) -> web.Response:
    dead_letter_id = _dead_letter_id(request)
    async with _connection(request) as connection:
        await discard(connection, [dead_letter_id])
        return await _summary_of(connection, dead_letter_id)


# -- the pieces every route shares -------------------------------------------------


class _BadId(Exception):
    pass


def _admin_route(handler: Handler) -> Handler:
    """Bearer token first, then the handler; its expected failures as JSON answers."""

    async def route(request: web.Request) -> web.Response:
        if not authorized(request, request.app[settings_key].admin_token):
            return error(401, "unauthorized", {"WWW-Authenticate": "Bearer"})
        try:
            return await handler(request)
        except _BadId:
            return error(400, "invalid_id")
        except DeadLetterNotFound:
            return error(404, "not_found")
        except NotReplayable:
            return error(409, "not_replayable")
        except _DATABASE_ERRORS as exc:
            log.warning("admin_database_unavailable", error=f"{type(exc).__name__}: {exc}")
            return error(503, "database_unavailable", {"Retry-After": "5"})

    return route


def authorized(request: web.Request, token: str) -> bool:
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(presented.strip().encode(), token.encode())


def _dead_letter_id(request: web.Request) -> int:
    dead_letter_id = parse_id(request.match_info["id"])
    if dead_letter_id is None:
        raise _BadId()
    return dead_letter_id


@contextlib.asynccontextmanager
async def _connection(request: web.Request) -> AsyncIterator[asyncpg.Connection]:
    async with request.app[admin_pool_key].acquire(timeout=ACQUIRE_TIMEOUT) as connection:
        yield connection


async def _summary_of(connection, dead_letter_id: int) -> web.Response:
    return _json(200, summary(await get_dead_letter(connection, dead_letter_id)))


def _json(status: int, document: object) -> web.Response:
    return web.Response(status=status, body=to_json(document), content_type="application/json")
