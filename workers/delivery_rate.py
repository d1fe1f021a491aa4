"""`forward`'s delivery rate, `handler_options.rate_limit = { per_second,
burst }` (docs/reference.md §7; why: docs/design.md, "Delivery rate"): a
downstream that can take 20 events a second gets no more, however many
workers forward to it.

Each run waits for its turn before its POST, on one GCRA bucket per source
(per route, for a source with routes: each route has its own downstream)
in Redis that every worker shares (shared/ratelimit.py, the ingress's
limiter): told to wait, it sleeps that long and asks again. The runs of a
process that ask at once are answered by one Redis call, so a backlog of
waiting runs costs about one call per process per turn, not one per run.
A run waits rather than fails: being early is not the event's fault, and
a retry would spend an attempt. `forward` never queries `ctx.db`, so a
waiting run holds no Postgres connection (workers/claim/handler_db.py); its
key's lock and lease are kept alive as for any run.

`burst` defaults to 1: a downstream that states a rate means it evenly.

With Redis away each worker process paces on its own at the whole rate, so
N workers may send up to N × per_second until Redis answers again (gauge
`webhook_forward_rate_limit_local`). Nothing cleverer, such as dividing by
a count of workers: that count would be shared state too, gone with Redis.
"""

import asyncio
import time
from collections.abc import Mapping

import redis.asyncio as redis
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from webhook_ingest.shared import ratelimit
from webhook_ingest.shared.observability import metrics
from webhook_ingest.shared.ratelimit import LocalBuckets, RateLimiter


class DeliveryRate(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    per_second: float = Field(gt=0)
    burst: int = Field(1, ge=1)


_EXPECTED = {"per_second": "must be a positive number", "burst": "must be a positive integer"}


def delivery_rate(options: Mapping) -> DeliveryRate | None:
    """The handler options' `rate_limit`, or None; ValueError saying which
    field is wrong (`rate_limit.burst: must be a positive integer`)."""
    rate = options.get("rate_limit")
    if rate is None:
        return None
    if not isinstance(rate, Mapping):
        raise ValueError("rate_limit: must be a table { per_second = N, burst = N }")
    try:
        return DeliveryRate.model_validate(rate)
    except ValidationError as exc:
        raise ValueError(_first_problem(exc)) from None


def _first_problem(exc: ValidationError) -> str:
    error = exc.errors(include_input=False, include_url=False)[0]
    field = ".".join(str(part) for part in error["loc"])
    if error["type"] == "extra_forbidden":
        return f"rate_limit.{field}: unknown field (known: {', '.join(sorted(DeliveryRate.model_fields))})"
    return f"rate_limit.{field}: {'is required' if error['type'] == 'missing' else _EXPECTED[field]}"


class SharedBuckets:
    """The process's buckets: in Redis from `open` (by each worker that
    starts) to the last `close`; in this process alone outside a worker."""

    def __init__(self) -> None:
        self._users = 0
        self._client: redis.Redis | None = None
        self._limiter: RateLimiter | None = None
        self._local = LocalBuckets()

    def open(self, redis_url: str, namespace: str) -> None:
        self._users += 1
        if self._limiter is None:
            self._client = ratelimit.connect(redis_url)
            self._limiter = RateLimiter(self._client, namespace, metrics.forward_rate_limit_local)

    async def close(self) -> None:
        self._users -= 1
        if self._users or self._limiter is None or self._client is None:
            return
        limiter, client, self._limiter, self._client = self._limiter, self._client, None, None
        await limiter.close()
        await client.aclose()

    async def retry_after(self, key: str, rate: DeliveryRate) -> float:
        if self._limiter is None:
            return self._local.retry_after(key, rate.per_second, rate.burst)
        return await self._limiter.retry_after(key, rate.per_second, rate.burst)


shared_buckets = SharedBuckets()


async def wait_for_turn(source: str, options: Mapping, route: str = "") -> None:
    """Returns once the delivery rate of the source (of its route, for a
    routed source: each route's own bucket) allows one more delivery (at
    once without one)."""
    rate = delivery_rate(options)
    if rate is None:
        return
    started = time.monotonic()
    while True:  # the bucket is in Redis: no event to wait on, only the time it says
        wait = await shared_buckets.retry_after(f"forward:{source}#{route}" if route else f"forward:{source}", rate)
        if not wait:
            break
        await asyncio.sleep(wait)
    metrics.forward_rate_wait.labels(source).inc(time.monotonic() - started)
