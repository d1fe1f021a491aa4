"""What an endpoint facing the internet needs besides signatures: who the
client is, per-source allowlists and rate limits, time limits for slow
clients, bounds on concurrent requests (ingress/intake/slots.py), a budget for
failed ones (ingress/intake/failure_budget.py), and the console's sign-in throttle.

Time limits: a connection must deliver a request's headers within
`header_timeout` of opening (or of its previous response) — aiohttp's own
keep-alive timer, armed when a connection opens, enforces that and also
closes idle keep-alive connections — and the whole body within
`body_timeout` (`read_body_within`); then the connection is closed.
"""

import asyncio
import math
import resource
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from aiohttp import hdrs, web

from webhook_ingest.ingress.appkeys import settings_key
from webhook_ingest.ingress.client_address import is_within, parse_address, setup_client_address
from webhook_ingest.ingress.ratelimit import SignInThrottle
from webhook_ingest.ingress.responses import Rejected, error
from webhook_ingest.shared import ratelimit
from webhook_ingest.shared.observability import get_logger, metrics
from webhook_ingest.shared.ratelimit import RateLimiter
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources import Source

from .content_encoding import UndecodableBody, decoder_for
from .failure_budget import FailureBudget, failure_budget_key
from .refusals import RefusalLog, refusal_log_key
from .slots import PROMPT_BODY_SECONDS, Slot, Slots, slots_key

log = get_logger(__name__)
T = TypeVar("T")

rate_limiter_key = web.AppKey("rate_limiter", RateLimiter)
# The console (a sub-app) reads it as request.config_dict[sign_in_throttle_key].
sign_in_throttle_key = web.AppKey("sign_in_throttle", SignInThrottle)


def handler_args(settings: Settings) -> dict[str, float | bool]:
    """`web.Application(handler_args=…)`: the header time limit, and no body
    decoded by aiohttp (ingress/intake/content_encoding.py decodes a webhook's)."""
    return {"keepalive_timeout": settings.header_timeout, "auto_decompress": False}


def setup_limits(app: web.Application, settings: Settings) -> None:
    """The client-address middleware (so everything after sees it), the
    slots, the failure budget, the rate limiter and its Redis client."""
    setup_client_address(app, settings.trusted_proxies, settings.client_address_header)
    refusals = app[refusal_log_key] = RefusalLog()
    app[slots_key] = Slots(settings.max_concurrent_requests, settings.max_bodies_per_client, refusals)
    app[failure_budget_key] = FailureBudget(refusals=refusals)
    app.cleanup_ctx.append(_rate_limiter_ctx)
    app.on_startup.append(_raise_open_files_limit)


def check_client_address(request: web.Request, source: Source) -> None:
    """403 `forbidden_source_ip` when the client is outside `allowed_ips`."""
    if source.allowed_ips and not is_within(parse_address(request.remote), source.allowed_ips):
        request.app[refusal_log_key].info("forbidden_source_ip", request.remote, source=source.name)
        raise Rejected(error(403, "forbidden_source_ip"))


async def check_rate_limit(request: web.Request, source: Source) -> None:
    """429 `rate_limited` + `Retry-After` (whole seconds) beyond `rate_limit`."""
    limit = source.rate_limit
    if limit is None:
        return
    wait = await request.app[rate_limiter_key].retry_after(f"source:{source.name}", limit.per_second, limit.burst)
    if wait > 0:
        raise Rejected(error(429, "rate_limited", {"Retry-After": str(max(1, math.ceil(wait)))}))


async def read_body_within(request: web.Request, slot: Slot, limit: int) -> bytes:
    """The body, decoded from its Content-Encoding, never past `limit`
    bytes as sent nor as decoded (413), within `body_timeout` (else 408 and
    the connection closed: a client dribbling its body holds a connection
    and a slot for nothing); a slow one counted against its client (`slot`)."""
    return await _within_body_timeout(request, slot, _read_body(request, limit))


async def read_form_within(request: web.Request, slot: Slot, limit: int) -> None:
    """A console form's body, its length stated (411) and within `limit`
    (413), not encoded (415: no browser compresses a form, and the limit is
    on what is read), read within `body_timeout` as a webhook's; read
    through aiohttp, which keeps it for `request.post()`."""
    if request.headers.get(hdrs.CONTENT_ENCODING, "identity").lower() != "identity":
        raise Rejected(error(415, "unsupported_media_type"))
    if request.content_length is None:
        raise Rejected(error(411, "length_required"))
    if request.content_length > limit:
        raise Rejected(error(413, "body_too_large"))
    await _within_body_timeout(request, slot, request.read())


async def _within_body_timeout(request: web.Request, slot: Slot, reading: Awaitable[T]) -> T:
    try:
        if request.content.is_eof():  # the body already whole (most: it came with the headers) cannot dribble
            return await reading
        async with asyncio.timeout(request.config_dict[settings_key].body_timeout):
            return await _counted_if_slow(request, slot, reading)
    except TimeoutError:
        log.info("body_timeout", client=request.remote, path=request.path)
        raise Rejected(await _answered_and_closed(request, error(408, "request_timeout"))) from None
    except (UndecodableBody, web.RequestPayloadError) as exc:  # a broken gzip stream, a broken chunk: bad input
        raise Rejected(error(400, "invalid_json")) from exc


async def _counted_if_slow(request: web.Request, slot: Slot, reading: Awaitable[T]) -> T:
    """`reading`'s result; counted against the client once it has taken
    `PROMPT_BODY_SECONDS` (a burst's bodies a segment behind their headers
    are not slow), answered 429 and closed when the client has too many
    slow ones already."""
    read = asyncio.ensure_future(reading)
    try:
        if not (await asyncio.wait({read}, timeout=PROMPT_BODY_SECONDS))[0]:
            await _counted_as_slow(request, slot)
        return await read
    finally:
        read.cancel()  # nothing when it is done; else it must not read on after a 429 or a timeout


async def _counted_as_slow(request: web.Request, slot: Slot) -> None:
    try:
        slot.body_slow()
    except Rejected as crowded:
        raise Rejected(await _answered_and_closed(request, crowded.response)) from None


async def _answered_and_closed(request: web.Request, response: web.Response) -> web.Response:
    """Sends `response`, then closes the connection at once: left to
    aiohttp, a response before the body was read is followed by up to 10 s
    of reading the rest (its lingering close), which is what a slow client
    wants."""
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    if request.transport is not None:
        request.transport.close()
    return response


async def _read_body(request: web.Request, limit: int) -> bytes:
    if request.content_length is not None and request.content_length > limit:
        raise Rejected(error(413, "body_too_large"))
    decoder = decoder_for(request.headers.get(hdrs.CONTENT_ENCODING))
    chunks, sent, size = [], 0, 0
    while chunk := await request.content.readany():
        sent += len(chunk)
        if decoder is not None and sent <= limit:
            chunk = decoder.decode(chunk, room=limit + 1 - size)
        size += len(chunk)
        if sent > limit or size > limit:
            raise Rejected(error(413, "body_too_large"))
        chunks.append(chunk)
    if decoder is not None:
        decoder.finish()
    return b"".join(chunks)


async def _rate_limiter_ctx(app: web.Application) -> AsyncIterator[None]:
    settings = app[settings_key]
    client = ratelimit.connect(settings.redis_urls[0])
    limiter = RateLimiter(client, settings.namespace, metrics.ingress_rate_limit_local)
    app[rate_limiter_key] = limiter
    app[sign_in_throttle_key] = SignInThrottle(limiter)
    yield
    await limiter.close()
    await client.aclose()


async def _raise_open_files_limit(app: web.Application) -> None:
    """Each connection is a file descriptor; the usual soft limit (1,024)
    would let a thousand idle connections stop the ingress accepting."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
