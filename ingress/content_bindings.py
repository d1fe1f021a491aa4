"""Signed content bound to the first identity it came with (docs/reference.md §5,
"An identity the signature does not cover"; why: docs/design.md "Identity from
what is signed"; its limits: docs/security.md "The event archive").

GitHub, Shopify, Twilio and GitLab sign no id and no time: their id (and
GitHub's and Shopify's type) is a header anyone may change. So when an
event's id or type was read from such a header, its signed content (the
body; Twilio's signed query and fields) is bound, per source, to the first
(key, type) it came with: `SET NS:content:SOURCE:SHA256 [key, type] NX GET
EX window`, one round trip to the first Redis master, pipelined on the
duplicate lookup's connection (ingress/redis_get.py) where the URL allows. The provider's own
redelivery (same id, same body) finds its own identity and takes the normal
path; the same content under another id or type is answered `duplicate` of
the first key and never queued.

The binding lives `WEBHOOK_INGEST_REPLAY_WINDOW` seconds (7 days, the
archive's retention). With Redis away the request takes the normal path
(the event is not lost) and the lookup is skipped for `RETRY_AFTER`
seconds, as the duplicate fast path does: a replay with a new id header
sent during an outage runs. Both are said in docs/security.md.
"""

import hashlib
import time
from collections.abc import Awaitable, Callable

import orjson
import redis.asyncio as redis

from webhook_ingest.ingress.redis_get import RedisReplyError
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.logging import get_logger
from webhook_ingest.shared.service_errors import REDIS_ERRORS

log = get_logger(__name__)

RETRY_AFTER = 1.0
BINDING_ERRORS = (*REDIS_ERRORS, RedisReplyError)

SetNxGet = Callable[[str, bytes, int], Awaitable[bytes | None]]


def client_set_nx_get(client: redis.Redis) -> SetNxGet:
    """The shared redis-py client's SET NX GET, where the URL allows no pipelined connection (TLS, a socket)."""
    async def set_nx_get(key: str, value: bytes, seconds: int) -> bytes | None:
        bound = await client.set(key, value, nx=True, get=True, ex=seconds)
        return bound if isinstance(bound, bytes) else None  # a client without decode_responses: bytes or None
    return set_nx_get


class ContentBindings:
    def __init__(self, set_nx_get: SetNxGet, namespace: str, window_seconds: int):
        self._set_nx_get = set_nx_get
        self._prefix = f"{namespace}:content:"
        self._window = window_seconds
        self._skip_until = 0.0

    async def first_key(self, source: str, signed_content: bytes, key: str, event_type: str | None) -> str | None:
        """The key `signed_content` was first accepted under, when it came with another (key, type) than
        these; None when it is these (bound now, or before), or when Redis cannot say."""
        if self._skip_until and time.monotonic() < self._skip_until:
            return None
        name = f"{self._prefix}{source}:{hashlib.sha256(signed_content).hexdigest()}"
        identity = orjson.dumps([key, event_type])
        try:
            bound = await self._set_nx_get(name, identity, self._window)
        except BINDING_ERRORS as exc:
            self._skip_until = time.monotonic() + RETRY_AFTER
            log.warning("content_binding_failed", error=describe(exc), retry_in=RETRY_AFTER)
            return None
        self._skip_until = 0.0
        if bound is None or bound == identity:
            return None
        return orjson.loads(bound)[0]
