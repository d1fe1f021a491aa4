"""The key's lease in Postgres, and keeping a lock or a lease alive.

A run holds, besides the Redis lock (a hint) and the key's turn (an advisory
lock that ends with its session), a lease written to the key's fence row in
its own autocommit statement: it outlives the session that took it. So a
holder whose Postgres connection died — a partition, a proxy cut — while
its handler goes on calling the outside world still keeps every other
worker off the key until the lease runs out, and a holder that cannot
extend its lease does not complete under it. The lease is short
(`WEBHOOK_INGEST_LOCK_TTL`, 5 s) and extended every third of it, so a key
whose holder was killed is free again within seconds. The whole argument:
docs/design.md, "Exclusion".

The lease and the fencing token are one write: taking the lease registers
a new token for the key.
"""

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from webhook_ingest.shared import metrics
from webhook_ingest.shared.logging import get_logger
from webhook_ingest.shared.queries import load_queries

log = get_logger(__name__)
SQL = load_queries("webhook_ingest.workers")
RENEW_RETRY_SECONDS = 0.2


@dataclass(frozen=True)
class Lease:
    key: str
    token: int


async def take_leases(connection, keys: list[str], ttl_ms: int) -> dict[str, Lease]:
    """The leases granted among `keys` (distinct), in one statement outside any transaction."""
    rows = await connection.fetch(SQL["take_leases"], keys, ttl_ms)
    return {row["key"]: Lease(row["key"], row["token"]) for row in rows}


async def extend_leases(pool, leases: list[Lease], ttl_ms: int) -> bool:
    """True when every lease was still ours and now runs `ttl_ms` longer."""
    async with pool.acquire(timeout=ttl_ms / 3000) as connection:
        extended = await connection.fetchval(SQL["extend_leases"], *_columns(leases), ttl_ms)
    return extended == len(leases)


async def release_leases(pool, leases: list[Lease]) -> None:
    """Best effort: a lease not released runs out by itself."""
    if not leases:
        return
    try:
        async with pool.acquire(timeout=5) as connection:
            await connection.execute(SQL["release_leases"], *_columns(leases))
    except Exception as exc:  # noqa: BLE001 - Postgres away: the lease expires instead
        log.info("lease_release_failed", error=f"{type(exc).__name__}: {exc}")


def _columns(leases: list[Lease]) -> tuple[list[str], list[int]]:
    return [lease.key for lease in leases], [lease.token for lease in leases]


class LockLost(Exception):
    """A lock or lease could not be kept while the handler ran: do not complete under it."""


class Keeper:
    """Keeps one lock or lease renewed while a handler runs; knows whether
    it was kept throughout.

    A failed renewal is tried again (a blip must not cost it); it counts as
    lost only once its validity ran out without a successful renewal — then
    the handler's work must not complete under it (`check`), and the event
    runs again later.
    """

    def __init__(self, name: str, renew: Callable[[], Awaitable[bool]], ttl_seconds: float,
                 valid_until: float | None = None):
        self.name = name
        self._renew = renew
        self._ttl = ttl_seconds
        self.valid_until = valid_until if valid_until is not None else time.monotonic() + ttl_seconds
        self.lost = False

    def check(self) -> None:
        if self.lost or time.monotonic() > self.valid_until:
            raise LockLost(self.name)

    async def keep(self) -> None:
        while not self.lost:
            await asyncio.sleep(self._ttl / 3)
            await self._renew_until_lost()

    async def _renew_until_lost(self) -> None:
        while True:
            started = time.monotonic()
            try:
                renewed = await self._renew()
            except Exception:  # noqa: BLE001 - a failed renewal is retried below
                renewed = False
            if renewed:
                self.valid_until = started + self._ttl * 0.99
                return
            metrics.idempotency_store_errors.labels(self.name).inc()
            if time.monotonic() + RENEW_RETRY_SECONDS > self.valid_until:
                self.lost = True
                log.warning("processing_lock_lost", holder=self.name)
                return
            await asyncio.sleep(RENEW_RETRY_SECONDS)
