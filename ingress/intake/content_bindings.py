"""Signed content bound to the ids it came with, one per type (docs/reference.md §5,
"An identity the signature does not cover"; why: docs/design.md "Identity from
what is signed"; its limits: docs/security.md "The event archive").

GitHub, Shopify, Twilio and GitLab sign no id and no time: their id (and
GitHub's and Shopify's type) is a header anyone may change. So when an
event's id or type was read from such a header, its signed content (the
body; Twilio's signed query and fields) is bound, per source, to the first
key it came with under each type: a hash `NS:content-ids:SOURCE:SHA256` of
type -> [key, ignore decision], one script on the first Redis master. The provider's own
redelivery (same id, same type) finds its own key and takes the normal
path; the same content under another id with a type it already came with,
or the same id with another type, is answered `duplicate` of the first key
and never queued. A source whose `ignore` rules read an unsigned header
binds their decision too: the same id with the rule's header changed is a
`duplicate`, not an ignored event that now runs. A Twilio form is bound
whatever its id: its signature joins names and values without a
separator, so forms with a boundary moved sign alike and, keyed by their
content hash, would be two keys. For Shopify alone, another id with
another type is a new event: Shopify sends one body under several topics
(products/create and products/update for one call), and that cannot be
told from a forged topic, so a replay may run its content once per topic,
at most `MAX_TYPES` of them. Every other scheme's content holds one type:
GitHub and GitLab send one body as one event type.

The binding lives `WEBHOOK_INGEST_REPLAY_WINDOW` seconds (7 days, the
archive's retention) from the content's first arrival. With Redis away (no
answer within its client's `BINDING_TIMEOUT_SECONDS`, ingress/redis_client.py)
the request takes the normal path (the event is not lost) and the lookup is
skipped for `RETRY_AFTER` seconds, as the duplicate fast path does: a
replay with a new id header sent during an outage runs. Both are said in
docs/security.md.
"""

import hashlib
import time

import orjson
import redis.asyncio as redis
from aiohttp import web

from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.observability import get_logger
from webhook_ingest.shared.service_errors import REDIS_ERRORS

log = get_logger(__name__)

RETRY_AFTER = 1.0
MAX_TYPES = 8  # the topics one Shopify body may come under: its few for one resource, a forger's few more
SEVERAL_TYPES = frozenset({"shopify"})  # the schemes whose provider sends one body under several types

# KEYS[1] the content's binding; ARGV: the type (JSON), the identity (JSON [key, ignore decision]), the
# window, MAX_TYPES. Nothing when the key is new under a new type (bound now) or the identity is the one
# bound under this type; else the identity the content was first accepted with: this type's, or this
# key's under another type, or any.
_BIND_LUA = """
local bound = redis.call('HGET', KEYS[1], ARGV[1])
if bound then
  if bound == ARGV[2] then return false end
  return bound
end
local identities = redis.call('HVALS', KEYS[1])
local key = cjson.decode(ARGV[2])[1]
for _, identity in ipairs(identities) do
  if cjson.decode(identity)[1] == key then return identity end
end
if #identities >= tonumber(ARGV[4]) then return identities[1] end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if #identities == 0 then redis.call('EXPIRE', KEYS[1], ARGV[3]) end
return false
"""


class ContentBindings:
    def __init__(self, client: redis.Redis, namespace: str, window_seconds: int):
        self._prefix = f"{namespace}:content-ids:"  # a hash; `content:` held a string before
        self._window = window_seconds
        self._skip_until = 0.0
        self._bind = client.register_script(_BIND_LUA)

    async def first_key(
        self,
        source: str,
        scheme: str,
        signed_content: bytes,
        key: str,
        event_type: str | None,
        ignored_by: str | None = None,
    ) -> str | None:
        """The key `signed_content` was first accepted under, when this (key, type) is not one it was
        bound to, or came with another ignore decision (`ignored_by`: the rule, for a source whose rules
        read an unsigned header; see the module's docstring); None when it is (bound now, or before), or
        Redis cannot say."""
        if self._skip_until and time.monotonic() < self._skip_until:
            return None
        name = f"{self._prefix}{source}:{hashlib.sha256(signed_content).hexdigest()}"
        try:
            bound = await self._bind(
                keys=[name],
                args=[
                    orjson.dumps(event_type),
                    orjson.dumps([key, ignored_by]),
                    self._window,
                    MAX_TYPES if scheme in SEVERAL_TYPES else 1,
                ],
            )
        except REDIS_ERRORS as exc:
            self._skip_until = time.monotonic() + RETRY_AFTER
            log.warning("content_binding_failed", error=describe(exc), retry_in=RETRY_AFTER)
            return None
        self._skip_until = 0.0
        return orjson.loads(bound)[0] if isinstance(bound, bytes) else None


content_bindings_key = web.AppKey("content_bindings", ContentBindings)
