"""Rate limits (a source's `rate_limit`, the console's sign-in throttle).

One algorithm, GCRA (the generic cell rate algorithm, a token bucket that
stores one number per key: the theoretical arrival time of the next
request): `burst` requests may arrive at once, then one every
`1 / per_second` seconds.

Shared by every ingress process through one Lua call per request on the
first `REDIS_URLS` master (the process's one client, short timeouts),
timed by Redis's own clock so the processes' clocks do not matter. When
Redis fails the limiter falls back to a bucket in this process — never
failing closed: an outage of Redis must not refuse webhooks — and tries
Redis again `RETRY_REDIS_AFTER` seconds later, so an outage costs one
timeout a second, not one per request.
"""

import time

import redis.asyncio as redis

from webhook_ingest.shared import metrics
from webhook_ingest.shared.logging import get_logger
from webhook_ingest.workers.redlock import REDIS_ERRORS

log = get_logger(__name__)

RETRY_REDIS_AFTER = 1.0
_MAX_LOCAL_KEYS = 10_000
_ROUNDING = 1e-9  # float error in `burst * interval`, not a wait

# KEYS[1]: the bucket; ARGV: microseconds per request, burst.
# Returns 0 when allowed, else the microseconds until it would be.
GCRA_LUA = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000000 + tonumber(now_parts[2])
local interval = tonumber(ARGV[1])
local tolerance = interval * tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local new_tat = tat + interval
local wait = new_tat - tolerance - now
if wait > 0 then return math.ceil(wait) end
redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX', math.ceil(tolerance / 1000) + 1)
return 0
"""


class LocalBuckets:
    """GCRA buckets held in this process (the fallback, and unit-testable)."""

    def __init__(self) -> None:
        self._next_free: dict[str, float] = {}

    def retry_after(self, key: str, per_second: float, burst: int, now: float | None = None) -> float:
        """0.0 when a request is allowed (and counted), else seconds to wait."""
        now = time.monotonic() if now is None else now
        interval = 1.0 / per_second
        new_tat = max(self._next_free.get(key, now), now) + interval
        wait = new_tat - burst * interval - now
        if wait > _ROUNDING:
            return wait
        self._next_free[key] = new_tat
        if len(self._next_free) > _MAX_LOCAL_KEYS:
            self._forget_full_buckets(now)
        return 0.0

    def _forget_full_buckets(self, now: float) -> None:
        # A key whose arrival time is past has a full bucket: same as absent.
        self._next_free = {key: tat for key, tat in self._next_free.items() if tat > now}


class RateLimiter:
    """`await retry_after(key, per_second, burst)`: 0.0 allowed, else seconds."""

    def __init__(self, client: redis.Redis, namespace: str):
        self._gcra = client.register_script(GCRA_LUA)
        self._prefix = f"{namespace}:ratelimit:"
        self._local = LocalBuckets()
        self._redis_retry_at = 0.0

    async def retry_after(self, key: str, per_second: float, burst: int) -> float:
        if self._redis_retry_at and time.monotonic() < self._redis_retry_at:
            return self._local.retry_after(key, per_second, burst)
        interval_us = max(1, round(1_000_000 / per_second))
        try:
            wait_us = await self._gcra(keys=[self._prefix + key], args=[interval_us, burst])
        except REDIS_ERRORS as exc:
            self._fall_back(exc)
            return self._local.retry_after(key, per_second, burst)
        if self._redis_retry_at:
            self._redis_retry_at = 0.0
            metrics.ingress_rate_limit_local.set(0)
            log.info("rate_limit_shared_again")
        return wait_us / 1_000_000

    def _fall_back(self, exc: BaseException) -> None:
        if not self._redis_retry_at:
            metrics.ingress_rate_limit_local.set(1)
            log.warning("rate_limit_per_process", error=f"{type(exc).__name__}: {exc}", retry_in=RETRY_REDIS_AFTER)
        self._redis_retry_at = time.monotonic() + RETRY_REDIS_AFTER


class SignInThrottle:
    """Sign-in attempts per client address, against password guessing:
    `burst` at once, then one every `60 / per_minute` seconds. Call
    `await throttle.retry_after(request.remote)` before checking a
    credential; answer 429 with `Retry-After` when it returns more than 0."""

    def __init__(self, limiter: RateLimiter, per_minute: float = 6, burst: int = 5):
        self._limiter = limiter
        self._per_second = per_minute / 60
        self._burst = burst

    async def retry_after(self, client_address: str | None) -> float:
        return await self._limiter.retry_after(f"sign-in:{client_address}", self._per_second, self._burst)
