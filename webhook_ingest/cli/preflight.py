"""Before a first run: do RabbitMQ, Redis and Postgres answer, and let us in?

Each problem becomes one readable line saying which service, at which URL,
and what to do — not a traceback: how to start a service that does not
answer; for one that answers and refuses (the credentials, a RabbitMQ
virtual host, a Redis database), what to fix in its URL, since starting it
would not help.
"""

import asyncio
import logging
from urllib.parse import unquote

import aiormq.exceptions
import asyncpg
import redis.asyncio as redis
from redis import exceptions as redis_errors
from yarl import URL

from webhook_ingest.shared.broker import amqp
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.settings import Settings, mask_url

HOW_TO_START = {
    "PostgreSQL": "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start",
    "Redis": "redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' --appendonly no",
    "RabbitMQ": "rabbitmq-server -detached",
}
URL_VARIABLE = {"PostgreSQL": "DATABASE_URL", "Redis": "REDIS_URLS", "RabbitMQ": "AMQP_URL"}
TIMEOUT = 3.0
# Errors that can only come from a server that answered (refused, not down).
ANSWERED = (
    asyncpg.PostgresError,
    redis_errors.ResponseError,
    redis_errors.AuthenticationError,
    aiormq.exceptions.ConnectionClosed,
    aiormq.exceptions.AuthenticationError,
    aiormq.exceptions.ProbableAuthenticationError,
    aiormq.exceptions.ProtocolSyntaxError,
)


async def service_problems(settings: Settings) -> list[str]:
    checks = [("PostgreSQL", url, _check_postgres(url)) for url in [settings.database_url]]
    checks += [("Redis", url, _check_redis(url)) for url in settings.redis_urls]
    checks += [("RabbitMQ", settings.amqp_url, _check_rabbitmq(settings.amqp_url))]
    results = await asyncio.gather(
        *(asyncio.wait_for(check, TIMEOUT) for _, _, check in checks), return_exceptions=True
    )
    return [
        _problem(service, url, result)
        for (service, url, _), result in zip(checks, results)
        if isinstance(result, BaseException)
    ]


def _problem(service: str, url: str, exc: BaseException) -> str:
    if isinstance(exc, ANSWERED):
        return f"{service} at {mask_url(url)} {_refused(service, url, exc)}"
    return (
        f"{service} is not reachable at {mask_url(url)} ({_reason(exc)}); start it with:"
        f" {HOW_TO_START[service]}   (or: docker compose up -d)"
    )


def _refused(service: str, url: str, exc: BaseException) -> str:
    """What a service that answered refused, and what to fix: it is running."""
    reason, variable = describe(exc), URL_VARIABLE[service]
    if isinstance(
        exc,
        (
            asyncpg.InvalidAuthorizationSpecificationError,
            redis_errors.AuthenticationError,
            redis_errors.AuthenticationWrongNumberOfArgsError,
            aiormq.exceptions.AuthenticationError,
            aiormq.exceptions.ProbableAuthenticationError,
        ),
    ):
        return f"refused the credentials ({reason}); it is running: check the user and password in {variable}"
    parsed = URL(url)
    if service == "RabbitMQ" and _vhost_refused(exc):
        vhost, user = unquote(parsed.raw_path[1:]) or "/", parsed.user or "guest"
        if not isinstance(exc, aiormq.exceptions.ConnectionNotAllowed):
            reason = "the connection closed at Connection.Open"
        return (
            f"refused the virtual host {vhost!r} ({reason}); it is running, and the virtual host does not exist"
            f" or {user!r} may not use it: rabbitmqctl add_vhost {vhost} && rabbitmqctl set_permissions"
            f" -p {vhost} {user} '.*' '.*' '.*'   (or fix {variable})"
        )
    if service == "Redis" and "DB index is out of range" in str(exc):
        return (
            f"has no database {parsed.path.strip('/')} ({reason}); it is running: choose one below its"
            f" `databases` setting in {variable}"
        )
    return f"refused the connection ({reason}); it is running: check {variable}"


def _vhost_refused(exc: BaseException) -> bool:
    """RabbitMQ closes the connection at Connection.Open (530, NOT_ALLOWED);
    aiormq reports it as the unexpected Connection.Close, without its text."""
    return isinstance(exc, aiormq.exceptions.ConnectionNotAllowed) or (
        isinstance(exc, aiormq.exceptions.InvalidFrameError) and "Connection.Close" in str(exc)
    )


async def _check_postgres(database_url: str) -> None:
    """The target database, not `postgres` (a managed server may forbid that
    one); one that does not exist yet still proves the server answers, and
    `migrate` then creates it."""
    try:
        connection = await asyncpg.connect(database_url, timeout=TIMEOUT)
    except asyncpg.InvalidCatalogNameError:
        return
    await connection.close()


async def _check_redis(url: str) -> None:
    client = redis.from_url(url, socket_connect_timeout=TIMEOUT)
    try:
        await client.ping()
    finally:
        await client.aclose()


async def _check_rabbitmq(url: str) -> None:
    # aiormq logs its own traceback-ish line on a refused connection; the
    # one line we print instead says the same and how to fix it.
    logging.getLogger("aiormq.connection").setLevel(logging.CRITICAL)
    connection = await amqp.connect(url, timeout=TIMEOUT)
    await connection.close()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, asyncio.TimeoutError):
        return "timed out"
    return describe(exc)
