"""The Redis side of idempotency: claim a key, remember its completion.

Redis answers duplicates early and keeps two workers off one key; it is never
the truth (Postgres is). When fewer than a quorum of masters answer, the
store says UNAVAILABLE and the worker runs on Postgres alone (degraded mode);
it then leaves Redis alone for `RETRY_AFTER` seconds before trying again, so
an outage costs one timeout a second, not one per message.

Claims and done markers asked for while one of their kind is on the wire go
together in the next pipeline (shared/db/group_commit.py), as the leases'
statements do (workers/claim/coalesced.py): hundreds of runs in flight (a
handler that waits on the network) cost a few round trips a moment, not two
each. A lone claim still goes at once; each caller gets its own key's answer,
the same as its own round trip would have been.
"""

import time
from collections.abc import Awaitable
from dataclasses import dataclass

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from webhook_ingest.shared.db import GroupCommit
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.observability import get_logger, metrics
from webhook_ingest.shared.redis_keys import DONE_PREFIX, done_marker, key_prefix
from webhook_ingest.shared.service_errors import REDIS_ERRORS

from .redlock import AcquireResult, Lock, Redlock
from .states import ClaimState

log = get_logger(__name__)

RETRY_AFTER = 1.0
SOCKET_TIMEOUT = 0.5
WRITERS = 2  # pipelines of one kind (claims, done markers) on the wire at once
MAX_BATCH = 256  # keys a pipeline: a default worker's concurrency


@dataclass(frozen=True)
class Claim:
    state: ClaimState
    lock: Lock | None = None
    completed_sha256: str | None = None


class IdempotencyStore:
    def __init__(self, redis_urls: tuple[str, ...], namespace: str, lock_ttl: float, done_ttl: int):
        self._clients = [_client(url) for url in redis_urls]
        self.redlock = Redlock(self._clients, lock_ttl)
        self._prefix = key_prefix(namespace)
        self._done_ttl = done_ttl
        self._skip_until = 0.0
        self.degraded = False
        self._claims: GroupCommit[str, Claim] = GroupCommit(self.claim_many, WRITERS, MAX_BATCH)
        self._done_markers: GroupCommit[tuple[str, str], None] = GroupCommit(self.complete_many, WRITERS, MAX_BATCH)

    async def close(self) -> None:
        for client in self._clients:
            await client.aclose()

    async def claim(self, idempotency_key: str) -> Claim:
        """The key's claim, in the next pipeline of claims (`claim_many`)."""
        if time.monotonic() < self._skip_until:
            return Claim(ClaimState.UNAVAILABLE)
        claim = await self._claims.submit(idempotency_key)
        assert claim is not None  # claim_many answers every key
        return claim

    async def claim_many(self, idempotency_keys: list[str]) -> list[Claim]:
        """`claim` for many keys in one round trip per master."""
        if time.monotonic() < self._skip_until:
            return [Claim(ClaimState.UNAVAILABLE)] * len(idempotency_keys)
        results = await self.redlock.acquire_many([self._prefix + key for key in idempotency_keys])
        return [self._claim_from(result) for result in results]

    def _claim_from(self, result: AcquireResult) -> Claim:
        self._count_errors(len(self._clients) - result.reachable)
        if result.lock is not None:
            self._recovered()
            return Claim(ClaimState.ACQUIRED, lock=result.lock)
        if result.holder_value and result.holder_value.startswith(DONE_PREFIX):
            self._recovered()
            return Claim(ClaimState.COMPLETED, completed_sha256=result.holder_value[len(DONE_PREFIX) :])
        if result.reachable < self.redlock.quorum:
            self._unavailable()
            return Claim(ClaimState.UNAVAILABLE)
        self._recovered()
        return Claim(ClaimState.BUSY)

    async def extend_many(self, locks: list[Lock]) -> list[Lock | None]:
        """`extend` for many locks, pipelined."""
        try:
            return await self.redlock.extend_many(locks)
        except REDIS_ERRORS:
            return [None] * len(locks)

    async def complete(self, idempotency_key: str, payload_sha256: str) -> None:
        """Remember the completion; replaces our lock. Best effort: Postgres has it.
        Written in the next pipeline of done markers (`complete_many`)."""
        if time.monotonic() < self._skip_until:
            return
        await self._done_markers.submit((idempotency_key, payload_sha256))

    async def complete_many(self, completions: list[tuple[str, str]]) -> None:
        """`complete` for many (key, payload_sha256) pairs, pipelined."""
        if time.monotonic() < self._skip_until or not completions:
            return
        items = [(self._prefix + key, done_marker(sha256)) for key, sha256 in completions]
        self._count_errors(await self.redlock.set_many_everywhere(items, self._done_ttl))

    async def release(self, lock: Lock) -> None:
        """Give the key back after a failure, so a retry may claim it at once."""
        await self.redlock.release(lock)

    def _count_errors(self, failed_calls: int) -> None:
        if failed_calls > 0:
            metrics.idempotency_store_errors.labels("redis").inc(failed_calls)

    def _unavailable(self) -> None:
        self._skip_until = time.monotonic() + RETRY_AFTER
        if not self.degraded:
            self.degraded = True
            metrics.idempotency_degraded.set(1)
            log.warning("idempotency_store_degraded", store="redis", mode="postgres-only")

    def _recovered(self) -> None:
        if self.degraded:
            self.degraded = False
            metrics.idempotency_degraded.set(0)
            log.info("idempotency_store_recovered", store="redis")


def _client(url: str) -> redis.Redis:
    # No client-side retries: a failed call is an answer (degraded mode), and
    # retrying would multiply the timeouts an outage costs.
    return redis.from_url(
        url, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT, retry=Retry(NoBackoff(), 0)
    )


async def quietly(awaitable: Awaitable[object]) -> None:
    """Redis bookkeeping after the fact (a release, a done marker): Postgres
    already has the truth, so a Redis error is logged, never raised."""
    try:
        await awaitable
    except REDIS_ERRORS as exc:
        log.info("redis_bookkeeping_failed", error=describe(exc))
