"""`forward`: POST the payload to `handler_options.url`.

One aiohttp session per process (opened on first use, closed by the worker
at shutdown), without aiohttp's default cap of 100 connections: the
worker's concurrency bounds the requests in flight, and a cap below it made
the 101st run wait for a connection (against a downstream answering in
300 ms, a default worker did at most 100 / 0.3 s = 333 events/s, not 853).

With `rate_limit` in its options, each run first waits for its turn
(workers/delivery_rate.py), before the POST and outside its timeout.

The idempotency key travels as `Idempotency-Key`, so the receiver can
deduplicate too. 2xx is success; a 4xx other than 408/429 can
never succeed (PermanentError); anything else is retried.
"""

import aiohttp

from webhook_ingest.shared import payloads
from webhook_ingest.workers.delivery_rate import wait_for_turn
from webhook_ingest.workers.handlers import Event, HandlerContext, PermanentError

DEFAULT_TIMEOUT_SECONDS = 10.0
_RETRYABLE_CLIENT_ERRORS = frozenset({408, 429})
_session: aiohttp.ClientSession | None = None


class ForwardFailed(Exception):
    """The receiver answered with a retryable status."""


def session() -> aiohttp.ClientSession:
    global _session
    if _session is None or _session.closed:
        _session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    return _session


async def close_session() -> None:
    if _session is not None:
        await _session.close()


async def handle(event: Event, ctx: HandlerContext) -> dict:
    await wait_for_turn(event.source, ctx.options, event.route)
    timeout = aiohttp.ClientTimeout(total=float(ctx.options.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)))
    headers = {
        "Idempotency-Key": event.key,
        "X-Webhook-Source": event.source,
        **({"X-Webhook-Route": event.route} if event.route else {}),
        "Content-Type": payloads.FORM if payloads.is_form(event.headers.get("content-type")) else "application/json",
    }
    async with session().post(ctx.options["url"], data=event.body, headers=headers, timeout=timeout) as response:
        status = response.status
    if 200 <= status < 300:
        return {"status": status}
    if 400 <= status < 500 and status not in _RETRYABLE_CLIENT_ERRORS:
        raise PermanentError(f"{ctx.options['url']} answered {status}")
    raise ForwardFailed(f"{ctx.options['url']} answered {status}")
