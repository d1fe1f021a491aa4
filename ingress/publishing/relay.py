"""The outbox relay: one task per ingress process moves outbox rows to the
events queue once the broker confirms again (docs/reference.md §6).

A round claims the oldest `BATCH_SIZE` rows that no other relay holds
(`FOR UPDATE SKIP LOCKED`) in a transaction held across their publishes,
publishes them with publisher confirms, deletes the confirmed ones and
commits. So several ingress processes never publish one row at the same
time, and a row leaves the table only after its confirm. A crash between
the confirm and the commit leaves the row to be published again: a copy,
which the workers settle like any other.

Pacing: after a batch the relay rests as long as the batch took, so a
backlog drains at about half of what the process could do and live
requests keep the other half (they publish straight to the broker meanwhile).

A row the relay cannot decode (written by another release, or damaged) is
not ours to drop: it stays for an operator, logged once
(`outbox_row_unreadable`) and counted (`webhook_outbox_unreadable`), and
the relay's later rounds claim past it, so the rows behind it are
published; one an operator deletes is forgotten.
"""

import asyncio
from collections.abc import AsyncIterator

import asyncpg
from aiohttp import web

from webhook_ingest.ingress.appkeys import database_pool_key
from webhook_ingest.shared.db import pooled, raise_if_cancelled
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.observability import get_logger, metrics, tracing
from webhook_ingest.shared.service_errors import POSTGRES_ERRORS

from .outbox import QUERIES, TIMEOUT_SECONDS, Outbox, decode_message, outbox_key
from .publisher import BrokerUnavailable, Publisher, publisher_key

log = get_logger(__name__)

# Small rounds: live requests publish on the same channel, behind a round's
# messages. With the broker back under 1,000 req/s, the p99 of live
# requests while 10k rows drained was 42-51 ms with rounds of 100, 13-15 ms
# with 20, 9-11 ms with 10; the drain took 3.4-3.9, 4.1-4.4 and 4.9-6.2 s.
BATCH_SIZE = 20
IDLE_POLL_SECONDS = 2.0  # rows stored by another process, or left by a killed one
BROKER_POLL_SECONDS = 0.2  # the publisher's own probe says when the broker confirms again
DATABASE_RETRY_SECONDS = 1.0
GAUGE_REFRESH_SECONDS = 5.0


async def relay_ctx(app: web.Application) -> AsyncIterator[None]:
    """aiohttp cleanup_ctx: the outbox, its relay and its gauges."""
    outbox = Outbox(app[database_pool_key])
    app[outbox_key] = outbox
    tasks = [
        asyncio.create_task(Relay(outbox, app[publisher_key]).run(), name="outbox-relay"),
        asyncio.create_task(refresh_backlog_gauges(outbox.pool), name="outbox-gauges"),
    ]
    yield
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class Relay:
    def __init__(self, outbox: Outbox, publisher: Publisher, batch_size: int = BATCH_SIZE):
        self._outbox = outbox
        self._publisher = publisher
        self._batch_size = batch_size
        self._unreadable: set[int] = set()  # ids of rows left for an operator

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._publisher.available:
                await asyncio.sleep(BROKER_POLL_SECONDS)
                continue
            started = loop.time()
            self._outbox.stored.clear()
            moved = await self._round()
            if moved:
                await asyncio.sleep(loop.time() - started)
            elif moved == 0:
                await self._idle()

    async def _round(self) -> int | None:
        """Rows handled, or None after a failure (already logged and waited on)."""
        try:
            return await self.relay_batch()
        except BrokerUnavailable as exc:  # the publisher now probes; we wait for it
            log.warning("outbox_relay_interrupted", error=str(exc))
        except POSTGRES_ERRORS as exc:
            raise_if_cancelled()
            log.warning("outbox_unreachable", error=describe(exc))
            await asyncio.sleep(DATABASE_RETRY_SECONDS)
        except Exception:  # a bug here must not end the relay: the rows would wait forever
            raise_if_cancelled()
            log.exception("outbox_relay_failed")
            await asyncio.sleep(DATABASE_RETRY_SECONDS)
        return None

    async def _idle(self) -> None:
        try:
            await asyncio.wait_for(self._outbox.stored.wait(), IDLE_POLL_SECONDS)
        except asyncio.TimeoutError:
            pass

    async def relay_batch(self) -> int:
        """One round: the rows it handled, relayed or set aside as unreadable
        (so a batch of unreadable ones is followed at once by the next).
        Raises BrokerUnavailable after committing the deletes of the rows
        that were confirmed before the broker failed."""
        async with pooled(self._outbox.pool, TIMEOUT_SECONDS) as connection, connection.transaction():
            if self._unreadable:
                self._unreadable = set(
                    await connection.fetchval(
                        QUERIES["outbox_rows_left"], list(self._unreadable), timeout=TIMEOUT_SECONDS
                    )
                )
            rows = await connection.fetch(
                QUERIES["claim_outbox_batch"], self._batch_size, list(self._unreadable), timeout=TIMEOUT_SECONDS
            )
            confirmed, failure = await self._publish(rows)
            metrics.outbox_unreadable.set(len(self._unreadable))
            if confirmed:
                await connection.execute(QUERIES["delete_outbox_rows"], confirmed, timeout=TIMEOUT_SECONDS)
        if confirmed:
            log.info("outbox_relayed", events=len(confirmed))
        if failure is not None:
            raise failure
        return len(rows)

    async def _publish(self, rows: list[asyncpg.Record]) -> tuple[list[int], BrokerUnavailable | None]:
        """Publishes the rows pipelined; the ids confirmed, and the first failure."""
        results = await asyncio.gather(*(self._publish_row(row) for row in rows), return_exceptions=True)
        confirmed = [row["id"] for row, result in zip(rows, results) if result is True]
        self._unreadable.update(row["id"] for row, result in zip(rows, results) if result is False)
        errors = [result for result in results if isinstance(result, BaseException)]
        for unexpected in (error for error in errors if not isinstance(error, BrokerUnavailable)):
            raise unexpected
        failures = [error for error in errors if isinstance(error, BrokerUnavailable)]
        return confirmed, failures[0] if failures else None

    async def _publish_row(self, row: asyncpg.Record) -> bool:
        try:
            event = decode_message(row["body"], row["amqp_headers"])
        except (KeyError, ValueError, TypeError) as exc:  # not ours to drop: stays for an operator
            log.error("outbox_row_unreadable", outbox_id=row["id"], error=describe(exc))
            return False
        with tracing.continued(event):  # its publish's span: a child of the request's, in the row
            await self._publisher.publish(event)
        return True


async def refresh_backlog_gauges(pool: asyncpg.Pool, every: float = GAUGE_REFRESH_SECONDS) -> None:
    """Forever: the gauges follow the table; a Postgres outage leaves them stale."""
    while True:
        try:
            async with pooled(pool, TIMEOUT_SECONDS) as connection:
                backlog = await connection.fetchrow(QUERIES["outbox_backlog"], timeout=TIMEOUT_SECONDS)
            metrics.outbox_pending.set(backlog["pending"])
            metrics.outbox_oldest_age.set(backlog["oldest_age_seconds"])
        except POSTGRES_ERRORS as exc:
            raise_if_cancelled()
            log.warning("outbox_gauges_stale", error=describe(exc))
        await asyncio.sleep(every)
