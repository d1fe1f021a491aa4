"""Ordered sources' intake (docs/design.md, "Ordering keys"): an event of a
source or route with `ordering` becomes a row of its lane in Postgres, not a
broker message, and is answered 200 once the row's insert committed.

- `laned`: what the request stores — one row per lane the event goes to (the
  source's, or each ordered route's that takes it), and the event to publish
  as today for what is not ordered (shared/sources/lanes.py decides, as for
  a replay by selection); a key that resolves to nothing is counted in
  `webhook_ordering_unkeyed_total`, and each row carries the request's span.
- `OrderedIntake`: the inserts of concurrent requests share one statement
  and commit (`GroupCommit`, as the outbox's); a request's rows are in one
  batch, so they commit together or not at all. Per lane the seqs follow
  commit order (shared/ordering/queries.sql). Postgres away: OrderedUnavailable,
  nothing written (the ingress answers 503). A commit whose answer was lost
  may still have written the rows: the provider's retry is then a copy, a
  row of its own, settled by the runner's per-event claim as any copy.
- After the commit, a lane that went idle -> busy gets a wake-up on
  NS.ordering, published in the background: never on the request's path,
  and one that fails is only logged and counted (the workers' watchdog
  finds the lane within a second).
"""

import asyncio
from collections.abc import AsyncIterator

import asyncpg
from aiohttp import web

from webhook_ingest.ingress.appkeys import database_pool_key, settings_key
from webhook_ingest.ingress.publishing import Publisher, publisher_key
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.db import GroupCommit, pooled
from webhook_ingest.shared.errors import ServiceUnavailable, describe
from webhook_ingest.shared.event import EventMessage
from webhook_ingest.shared.observability import get_logger, metrics, tracing
from webhook_ingest.shared.ordering import Accepted, OrderedRow, insert_ordered
from webhook_ingest.shared.service_errors import BROKER_ERRORS, POSTGRES_ERRORS
from webhook_ingest.shared.sources import Laned, Source
from webhook_ingest.shared.sources import laned as lanes_of

log = get_logger(__name__)

TIMEOUT_SECONDS = 5.0  # to get a connection, then for the statement: as the outbox's
WRITERS, MAX_BATCH = 2, 100  # inserts at once, and requests in one (docs/design.md, "Ordering keys")
Rows = tuple[OrderedRow, ...]


class OrderedUnavailable(ServiceUnavailable):
    """The rows' insert did not commit (as far as the ingress knows): the event is not accepted."""


def laned(source: Source, event: EventMessage, payload: object) -> Laned:
    """Where `event` of `source` goes: rows of its lanes (carrying the request's
    span), and the event to publish for what is not ordered. `payload` is what
    the ingress read (the routes' filters and the keys read it)."""
    found = lanes_of(source, event, payload, tracing.carried)
    for route in found.unkeyed:
        metrics.ordering_unkeyed.labels(source.name).inc()
        log.debug("ordering_unkeyed", source=source.name, route=route, key=event.key)
    return found


class OrderedIntake:
    def __init__(self, pool: asyncpg.Pool, publisher: Publisher, namespace: str):
        self._pool = pool
        self._publisher = publisher
        self._namespace = namespace
        writers = max(1, min(WRITERS, pool.get_max_size() - 2))  # room for the outbox, its relay, the API
        self._inserts: GroupCommit[Rows, list[Accepted]] = GroupCommit(self._insert, writers, MAX_BATCH)
        self._wake_ups: set[asyncio.Task] = set()

    async def store(self, event: EventMessage, rows: Rows) -> list[Accepted]:
        """Returns once a committed insert holds `rows` (each row's lane and seq);
        raises OrderedUnavailable when it did not commit. Then wakes the lanes
        that went idle -> busy, in the background."""
        with tracing.span("ordered store", event, failed_by_errors=True):
            try:
                accepted = await self._inserts.submit(rows)
            except POSTGRES_ERRORS as exc:
                raise OrderedUnavailable(describe(exc)) from exc
        places = accepted or []  # _insert answers every item
        for place in places:
            if place.woke:
                self._wake(place.lane)
        return places

    async def _insert(self, batch: list[Rows]) -> list[list[Accepted]]:
        rows = [row for rows in batch for row in rows]
        async with pooled(self._pool, TIMEOUT_SECONDS) as connection, asyncio.timeout(TIMEOUT_SECONDS):
            accepted = await insert_ordered(connection, rows)  # cut short: the connection is closed, not reused
        answers, start = [], 0
        for item in batch:
            answers.append(accepted[start : start + len(item)])
            start += len(item)
        return answers

    def _wake(self, lane: str) -> None:
        channel = self._publisher.channel
        if channel is None or not self._publisher.ready:
            return _wake_failed(lane, "not connected to the broker")
        task = asyncio.create_task(self._publish_wake(channel, lane), name="ordering-wake-up")
        self._wake_ups.add(task)
        task.add_done_callback(self._wake_ups.discard)

    async def _publish_wake(self, channel, lane: str) -> None:
        try:
            await topology.publish_wake(channel, self._namespace, lane)
        except BROKER_ERRORS as exc:
            _wake_failed(lane, describe(exc))

    async def close(self) -> None:
        """Wake-ups still in flight are dropped: the watchdog finds their lanes."""
        for task in list(self._wake_ups):
            task.cancel()
        await asyncio.gather(*self._wake_ups, return_exceptions=True)


def _wake_failed(lane: str, error: str) -> None:
    metrics.ordering_wake_ups_failed.inc()
    log.info("ordering_wake_up_failed", lane=lane, error=error)


async def ordered_intake_ctx(app: web.Application) -> AsyncIterator[None]:
    """aiohttp cleanup_ctx: the ordered sources' inserts and wake-ups (after the pool's and the publisher's)."""
    intake = OrderedIntake(app[database_pool_key], app[publisher_key], app[settings_key].namespace)
    app[ordered_intake_key] = intake
    yield
    await intake.close()


ordered_intake_key = web.AppKey("ordered_intake", OrderedIntake)
