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

`headers` in its options are sent with every POST, a value `env:NAME` or
`file:/path` read as a source's secrets are (shared/sources/model.py), once per
process: the way to send a credential. A URL's own credentials still work,
and every error text says the URL redacted (shared/errors.py).
"""

import functools

import aiohttp

from webhook_ingest.shared.errors import redacted
from webhook_ingest.shared.event import payloads
from webhook_ingest.workers.delivery_rate import wait_for_turn

from .interface import Event, HandlerContext, PermanentError

DEFAULT_TIMEOUT_SECONDS = 10.0
_RETRYABLE_CLIENT_ERRORS = frozenset({408, 429})
# What forward sets itself, or aiohttp from the body: never from `headers`.
OWN_HEADERS = frozenset(
    {
        "idempotency-key",
        "x-webhook-source",
        "x-webhook-route",
        "content-type",
        "content-length",
        "transfer-encoding",
        "host",
    }
)
_session: aiohttp.ClientSession | None = None


class ForwardFailed(Exception):
    """The receiver answered with a retryable status."""


def session() -> aiohttp.ClientSession:
    global _session
    if _session is None or _session.closed:
        # no cookie jar: the session is every source's, and a POST carries only what the source says
        _session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), cookie_jar=aiohttp.DummyCookieJar())
    return _session


async def close_session() -> None:
    if _session is not None:
        await _session.close()


async def handle(event: Event, ctx: HandlerContext) -> dict:
    await wait_for_turn(event.source, ctx.options, event.route)
    timeout = aiohttp.ClientTimeout(total=float(ctx.options.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)))
    headers = {
        **sent_headers(ctx.options),
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
        raise PermanentError(f"{redacted(ctx.options['url'])} answered {status}")
    raise ForwardFailed(f"{redacted(ctx.options['url'])} answered {status}")


def sent_headers(options: dict) -> dict[str, str]:
    """`options["headers"]`, their secrets resolved (ValueError saying which
    one cannot be); the worker checks them at start (`_check_forward_options`)."""
    headers = options.get("headers") or {}
    return _resolved(tuple(headers.items())) if headers else {}


@functools.cache  # a file: secret is read once per process, as a source's are
def _resolved(headers: tuple[tuple[str, str], ...]) -> dict[str, str]:
    from webhook_ingest.shared.sources import resolve_secret

    resolved = {}
    for name, value in headers:
        try:
            resolved[name] = resolve_secret(value)
        except ValueError as exc:
            raise ValueError(f"headers.{name}: {exc}") from None
    return resolved
