"""Rate limits shared by every process through Redis: the ingress's (a
source's `rate_limit`, the console's sign-in throttle, ingress/ratelimit.py)
and the workers' (`forward`'s delivery rate, workers/delivery_rate.py).

One algorithm, GCRA (the generic cell rate algorithm, a token bucket that
stores one number per key: the theoretical arrival time of the next
request): `burst` requests may arrive at once, then one every
`1 / per_second` seconds.

Shared by every process through one Lua call on the first `REDIS_URLS`
master (one client per process, owned by its app or worker), timed by
Redis's own clock so the processes' clocks do not matter. Requests for one
key that arrive while a call is on the wire wait for the next call, which
asks for all of them at once: under load one call serves many requests
(a redis-py call costs ~80 µs of CPU, and each call is one more chance of
a timeout on a busy event loop); when idle a request's call goes out at once.

Its timeout (`TIMEOUT_SECONDS`) is longer than the duplicate lookup's:
a lookup that times out only loses a shortcut, while a limiter that falls
back admits up to one bucket per process, and a busy event loop alone
(not Redis) can make a 75 ms answer look late.

When Redis fails, the limiter falls back to a bucket in this process —
never failing closed: an outage of Redis must not refuse webhooks nor stop
deliveries; each process then allows the whole rate on its own — and
tries Redis again `RETRY_REDIS_AFTER` seconds later, so an outage costs one
timeout a second, not one per request. The local bucket counts every
request all along, so a fallback starts from this process's own recent
traffic instead of granting a fresh burst.
"""

import asyncio
import itertools
import time
from collections.abc import Iterable

import redis.asyncio as redis
from prometheus_client import Gauge
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from webhook_ingest.shared.observability import get_logger

from .errors import describe
from .service_errors import REDIS_ERRORS

log = get_logger(__name__)

RETRY_REDIS_AFTER = 1.0
TIMEOUT_SECONDS = 0.25
CONNECT_TIMEOUT_SECONDS = 0.5
_MAX_LOCAL_KEYS = 10_000
_SWEEP_SECONDS = 60.0
_ROUNDING = 1e-9  # float error in `burst * interval`, not a wait

MAX_BATCH = 256

# KEYS[1]: the bucket; ARGV: microseconds per request, burst, requests asking.
# Returns {requests allowed, microseconds until the next one would be}.
GCRA_LUA = """
local now_parts = redis.call('TIME')
local now = tonumber(now_parts[1]) * 1000000 + tonumber(now_parts[2])
local interval = tonumber(ARGV[1])
local tolerance = interval * tonumber(ARGV[2])
local asking = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local allowed = 0
while allowed < asking and tat + interval - tolerance <= now do
  tat = tat + interval
  allowed = allowed + 1
end
if allowed > 0 then
  redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', math.ceil(tolerance / 1000) + 1)
end
if allowed == asking then return {allowed, 0} end
return {allowed, math.ceil(tat + interval - tolerance - now)}
"""


class LocalBuckets:
    """GCRA buckets held in this process (the fallback, and unit-testable)."""

    def __init__(self) -> None:
        self._next_free: dict[str, float] = {}
        self._sweep_past = _MAX_LOCAL_KEYS
        self._swept_at = 0.0

    def retry_after(self, key: str, per_second: float, burst: int, now: float | None = None) -> float:
        """0.0 when a request is allowed (and counted), else seconds to wait."""
        now = time.monotonic() if now is None else now
        wait = self.wait(key, per_second, burst, now)
        if wait:
            return wait
        self._next_free[key] = max(self._next_free.get(key, now), now) + 1.0 / per_second
        if self._sweep_due(now):
            self._forget_full_buckets(now)
            self._swept_at = now
            self._sweep_past = max(_MAX_LOCAL_KEYS, 2 * len(self._next_free))
        return 0.0

    def _sweep_due(self, now: float) -> bool:
        # Once the keys left by the last sweep have doubled, so each sweep pays for
        # itself (with more than _MAX_LOCAL_KEYS buckets not full, a sweep per request
        # looked at every one of them); or a minute after it, past _MAX_LOCAL_KEYS,
        # so a flood's keys are let go soon after it.
        keys = len(self._next_free)
        return keys > self._sweep_past or (keys > _MAX_LOCAL_KEYS and now - self._swept_at >= _SWEEP_SECONDS)

    def wait(self, key: str, per_second: float, burst: int, now: float | None = None) -> float:
        """What `retry_after` would answer now, counting nothing."""
        now = time.monotonic() if now is None else now
        interval = 1.0 / per_second
        wait = max(self._next_free.get(key, now), now) + interval - burst * interval - now
        return wait if wait > _ROUNDING else 0.0

    def _forget_full_buckets(self, now: float) -> None:
        # A key whose arrival time is past has a full bucket: same as absent.
        self._next_free = {key: tat for key, tat in self._next_free.items() if tat > now}


def connect(url: str) -> redis.Redis:
    """The limiter's client: no client-side retries (a failure is an answer: fall back)."""
    return redis.from_url(
        url, socket_timeout=TIMEOUT_SECONDS, socket_connect_timeout=CONNECT_TIMEOUT_SECONDS, retry=Retry(NoBackoff(), 0)
    )


class RateLimiter:
    """`await retry_after(key, per_second, burst)`: 0.0 allowed, else seconds.
    `local_gauge` is set to 1 while this process counts on its own."""

    def __init__(self, client: redis.Redis, namespace: str, local_gauge: Gauge):
        self._gcra = client.register_script(GCRA_LUA)
        self._local_gauge = local_gauge
        self._prefix = f"{namespace}:ratelimit:"
        self._local = LocalBuckets()
        self._redis_retry_at = 0.0
        self._waiting: dict[str, list[asyncio.Future]] = {}
        self._senders: dict[str, asyncio.Task] = {}

    async def retry_after(self, key: str, per_second: float, burst: int) -> float:
        local_wait = self._local.retry_after(key, per_second, burst)
        if self._redis_retry_at and time.monotonic() < self._redis_retry_at:
            return local_wait
        shared_wait = await self._shared(key, per_second, burst)
        return local_wait if shared_wait is None else shared_wait

    async def close(self) -> None:
        for sender in list(self._senders.values()):
            sender.cancel()
        await asyncio.gather(*self._senders.values(), return_exceptions=True)

    def _shared(self, key: str, per_second: float, burst: int) -> asyncio.Future:
        """The shared bucket's answer for one request; None when Redis failed."""
        answer = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, []).append(answer)
        if key not in self._senders:
            self._senders[key] = asyncio.create_task(self._send(key, per_second, burst), name=f"rate-limit {key}")
        return answer

    async def _send(self, key: str, per_second: float, burst: int) -> None:
        batch: list[asyncio.Future] = []
        try:
            while waiting := self._waiting.pop(key, None):
                batch = waiting[:MAX_BATCH]
                if len(waiting) > MAX_BATCH:
                    self._waiting[key] = waiting[MAX_BATCH:]
                _answer(batch, await self._ask(key, per_second, burst, len(batch)))
                batch = []
        finally:
            del self._senders[key]
            # Cancelled at shutdown (or a bug): whoever still waits gets its
            # local bucket's answer, never an error.
            _answer(batch + self._waiting.pop(key, []), itertools.repeat(None))

    async def _ask(self, key: str, per_second: float, burst: int, asking: int) -> list[float | None]:
        """Seconds to wait for each of `asking` requests, in order (0.0: allowed)."""
        interval_us = max(1, round(1_000_000 / per_second))
        try:
            allowed, wait_us = await self._gcra(keys=[self._prefix + key], args=[interval_us, burst, asking])
        except REDIS_ERRORS as exc:
            self._fall_back(exc)
            return [None] * asking
        if self._redis_retry_at:
            self._redis_retry_at = 0.0
            self._local_gauge.set(0)
            log.info("rate_limit_shared_again")
        return [0.0] * allowed + [wait_us / 1_000_000] * (asking - allowed)

    def _fall_back(self, exc: BaseException) -> None:
        if not self._redis_retry_at:
            self._local_gauge.set(1)
            log.warning("rate_limit_per_process", error=describe(exc), retry_in=RETRY_REDIS_AFTER)
        self._redis_retry_at = time.monotonic() + RETRY_REDIS_AFTER


def _answer(answers: list[asyncio.Future], waits: Iterable[float | None]) -> None:
    for answer, wait in zip(answers, waits):
        if not answer.done():  # its request may have been cancelled meanwhile
            answer.set_result(wait)
