"""A budget per client for requests that fail verification.

A source's `rate_limit` is the provider's budget, so only a request whose
signature verified spends it: otherwise anyone could keep a source at 429
with unsigned POSTs, and a provider that does not redeliver (GitHub) would
lose its events. What fails instead — a missing or wrong signature, a stale
timestamp, a body too large, too slow or undecodable — spends a budget of
its client's (the address `client_address` found): `FAILURES_BURST` at once,
then `FAILURES_PER_SECOND`.

A webhook request is always read and verified, whatever its client's
budget: Stripe, GitHub and Shopify deliver every customer's webhooks from a
few shared addresses, and anyone can point their own account at our URL
with a wrong secret; refused before its body was read, the provider's
valid delivery from that address was refused with them. A failure past the
budget is answered 429 `too_many_failures` instead (logged once a minute,
not a `signature_rejected` line each), so what a flood of failures costs is
what any request costs: a body read within the slots' bounds and one HMAC.
The admin API's bearer token is different: a guesser over the budget is
refused before the token is looked at, the right one too (`refuse_if_spent`).

The budget is kept in each process (LocalBuckets), not in Redis like the
rate limits: it guards this process's work, and a Redis call on the path of
every request would cost each delivery a round trip for it. With N ingress
processes a client may fail up to N times the budget.
"""

import math

from aiohttp import web

from webhook_ingest.ingress.client_address import client_key
from webhook_ingest.ingress.responses import Rejected, error
from webhook_ingest.shared.ratelimit import LocalBuckets

from .refusals import RefusalLog

FAILURES_BURST = 20
FAILURES_PER_SECOND = 1.0


class FailureBudget:
    def __init__(
        self, burst: int = FAILURES_BURST, per_second: float = FAILURES_PER_SECOND, refusals: RefusalLog | None = None
    ):
        self._buckets = LocalBuckets()
        self._refusals = refusals or RefusalLog()
        self._burst = burst
        self._per_second = per_second

    def refuse_if_spent(self, client: str | None) -> None:
        """429 `too_many_failures` + `Retry-After` when `client` has no failure left."""
        wait = self._buckets.wait(client_key(client), self._per_second, self._burst)
        if wait > 0:
            raise self._refused(client, wait)

    def has_failures_left(self, client: str | None) -> bool:
        return self._buckets.wait(client_key(client), self._per_second, self._burst) == 0.0

    def charge(self, client: str | None) -> None:
        """One failed request of `client`'s (beyond its budget: nothing more to count)."""
        self._buckets.retry_after(client_key(client), self._per_second, self._burst)

    def charged(self, client: str | None, failure: Rejected) -> Rejected:
        """One failed request of `client`'s, and its answer: `failure`
        within the budget (or when already sent), past it 429 `too_many_failures`."""
        wait = self._buckets.retry_after(client_key(client), self._per_second, self._burst)
        if wait == 0.0 or failure.response.prepared:
            return failure
        return self._refused(client, wait)

    def _refused(self, client: str | None, wait: float) -> Rejected:
        self._refusals.info("too_many_failures", client)
        return Rejected(error(429, "too_many_failures", {"Retry-After": str(max(1, math.ceil(wait)))}))


failure_budget_key = web.AppKey("failure_budget", FailureBudget)
