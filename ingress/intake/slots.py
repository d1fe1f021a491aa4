"""How many webhook requests one ingress process works on, and how many of
them one client may hold while their bodies are still arriving.

A slot is taken only once the headers are vetted (a known source, a client
inside its allowlist), so a request refused for those holds nothing.
Beyond `WEBHOOK_INGEST_MAX_CONCURRENT_REQUESTS` slots the answer is 503 at
once: queueing without end only turns overload into timeouts. And one
client address may have at most `WEBHOOK_INGEST_MAX_BODIES_PER_CLIENT`
requests whose body is still arriving `PROMPT_BODY_SECONDS` after the
handler began to read it: beyond, that request is answered 429 and its
connection closed. A body trickling in holds its slot up to
`WEBHOOK_INGEST_BODY_TIMEOUT`; without the per-client bound, one client
with a few hundred slow connections answered every source 503.

A body that came with its headers, or just behind them, is not arriving:
counted from the slot on, a provider's burst from one address (64
deliveries, their bodies a segment behind their headers) had every
delivery past the 32nd refused, and GitHub does not redeliver.
"""

import contextlib
from collections.abc import Iterator

from aiohttp import web

from webhook_ingest.ingress.client_address import client_key
from webhook_ingest.ingress.responses import Rejected, error

from .refusals import RefusalLog

# Over the internet a body sent with its headers is all there within a round
# trip or two; one still arriving after this is slow, and counts.
PROMPT_BODY_SECONDS = 1.0


class Slots:
    def __init__(self, limit: int, bodies_per_client: int, refusals: RefusalLog | None = None):
        self._limit = limit
        self._bodies_per_client = bodies_per_client
        self._refusals = refusals or RefusalLog()
        self._in_flight = 0
        self._bodies_arriving: dict[str, int] = {}

    @contextlib.contextmanager
    def taken(self, client: str | None) -> Iterator["Slot"]:
        """A slot for one request of `client`'s; 503 (Rejected) when there is none."""
        if self._in_flight >= self._limit:
            raise Rejected(error(503, "unavailable", {"Retry-After": "1"}))
        slot = Slot(self, client_key(client))  # an IPv6 client is its /64
        self._in_flight += 1
        try:
            yield slot
        finally:
            self._in_flight -= 1
            slot.body_arrived()

    def _count_body(self, client: str, change: int) -> None:
        count = self._bodies_arriving.get(client, 0) + change
        if count:
            self._bodies_arriving[client] = count
        else:
            del self._bodies_arriving[client]  # a key per client seen would only grow

    def _refuse_if_crowded(self, client: str) -> None:
        if self._bodies_arriving.get(client, 0) >= self._bodies_per_client:
            self._refusals.info("too_many_bodies_arriving", client)
            raise Rejected(error(429, "too_many_open_requests", {"Retry-After": "1"}))


class Slot:
    """One request's slot; a slow body counts against its client until it has arrived."""

    def __init__(self, slots: Slots, client: str):
        self._slots = slots
        self._client = client
        self._arriving = False

    def body_slow(self) -> None:
        """The body is still arriving after `PROMPT_BODY_SECONDS`: counted
        against its client from now on, or 429 (Rejected) when the client
        already has `bodies_per_client` such bodies."""
        self._slots._refuse_if_crowded(self._client)
        self._arriving = True
        self._slots._count_body(self._client, +1)

    def body_arrived(self) -> None:
        if self._arriving:
            self._arriving = False
            self._slots._count_body(self._client, -1)


slots_key = web.AppKey("slots", Slots)
