"""The duplicate fast path (docs/reference.md §6, `200 {"status":"duplicate"}`).

The workers write `NS:key:<key>` = `done:<payload_sha256>` on every Redis
master once a key completed (`shared/redis_keys.py`). A copy of a completed
event whose payload hash equals the marker's needs no publish and no
consume: the ingress answers `duplicate` from one GET. Anything uncertain —
no marker, another hash (a conflict the workers must record), an error or
a timeout — answers False and the event takes the normal path, so this can
only save work, never change an outcome. After a Redis error the lookup is
skipped for `RETRY_AFTER` seconds, so an outage costs one timeout a second,
not one per request.
"""

import time
from collections.abc import Awaitable, Callable

from aiohttp import web

from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.observability import get_logger
from webhook_ingest.shared.redis_keys import done_marker, key_prefix
from webhook_ingest.shared.service_errors import REDIS_ERRORS

from .redis_get import RedisReplyError

log = get_logger(__name__)

RETRY_AFTER = 1.0
LOOKUP_ERRORS = (*REDIS_ERRORS, RedisReplyError)


class DoneMarkers:
    def __init__(self, get: Callable[[str], Awaitable[bytes | str | None]], namespace: str):
        self._get = get  # GetPipeline.get, or the shared redis-py client's get
        self._prefix = key_prefix(namespace)
        self._skip_until = 0.0

    async def completed_with(self, key: str, payload_sha256: str) -> bool:
        """True only when Redis says `key` completed with this very payload."""
        if self._skip_until and time.monotonic() < self._skip_until:
            return False
        try:
            marker = await self._get(self._prefix + key)
        except LOOKUP_ERRORS as exc:
            self._skip_until = time.monotonic() + RETRY_AFTER
            log.warning("duplicate_lookup_failed", error=describe(exc), retry_in=RETRY_AFTER)
            return False
        self._skip_until = 0.0
        return marker == _expected(payload_sha256)


def _expected(payload_sha256: str) -> bytes:
    return done_marker(payload_sha256).encode()


done_markers_key = web.AppKey("done_markers", DoneMarkers)
