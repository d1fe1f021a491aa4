"""The console's sign-in throttle, on the rate limiter every process shares
(shared/ratelimit.py, which also serves a source's `rate_limit`)."""

from webhook_ingest.shared.ratelimit import RateLimiter

from .client_address import client_key


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
        # an IPv6 client is its /64 (client_address.client_key)
        return await self._limiter.retry_after(f"sign-in:{client_key(client_address)}", self._per_second, self._burst)
