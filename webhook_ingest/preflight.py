"""Before a first run: can we reach RabbitMQ, Redis and Postgres?

Each unreachable service becomes one readable line saying which service, at
which URL, and how to start it — not a traceback.
"""

import asyncio
import logging

import asyncpg
import redis.asyncio as redis

from webhook_ingest.shared import amqp
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.settings import Settings, mask_url

HOW_TO_START = {
    "PostgreSQL": "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start",
    "Redis": "redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save '' --appendonly no",
    "RabbitMQ": "rabbitmq-server -detached",
}
TIMEOUT = 3.0


async def unreachable_services(settings: Settings) -> list[str]:
    checks = [("PostgreSQL", url, _check_postgres(url)) for url in [settings.database_url]]
    checks += [("Redis", url, _check_redis(url)) for url in settings.redis_urls]
    checks += [("RabbitMQ", settings.amqp_url, _check_rabbitmq(settings.amqp_url))]
    results = await asyncio.gather(
        *(asyncio.wait_for(check, TIMEOUT) for _, _, check in checks), return_exceptions=True
    )
    return [
        f"{service} is not reachable at {mask_url(url)} ({_reason(result)}); start it with:"
        f" {HOW_TO_START[service]}   (or: docker compose up -d)"
        for (service, url, _), result in zip(checks, results)
        if isinstance(result, BaseException)
    ]


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
