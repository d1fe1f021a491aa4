"""Log lines about clients refused before anything was spent on them.

A client over its failure budget (429), with too many bodies arriving
(429), or outside a source's allowlist (403) is refused before its body is
read, so no budget bounds how often it is refused: logged on every refusal,
one client wrote a log line per few bytes it sent, for as long as it liked.
Each such line is written at most once a minute per kind, client (an IPv6
client by its /64) and source; `webhook_ingress_requests_total` still counts
every refusal.
"""

from aiohttp import web

from webhook_ingest.ingress.client_address import client_key
from webhook_ingest.shared.observability import get_logger
from webhook_ingest.shared.ratelimit import LocalBuckets

log = get_logger(__name__)

LOG_EVERY_SECONDS = 60.0


class RefusalLog:
    def __init__(self, seconds: float = LOG_EVERY_SECONDS):
        self._logged = LocalBuckets()
        self._per_second = 1.0 / seconds

    def info(self, event: str, client: str | None, **fields: str) -> None:
        """`log.info(event, client=client, **fields)`, unless the same line was written within the minute."""
        key = " ".join([event, client_key(client), *fields.values()])
        if self._logged.retry_after(key, self._per_second, burst=1) == 0.0:
            log.info(event, client=client, **fields)


refusal_log_key = web.AppKey("refusal_log", RefusalLog)
