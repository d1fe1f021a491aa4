"""One message, one pass through the idempotency state machine.

1. Claim the key in Redis (`SET NX` on a majority of masters = the Redlock
   processing lock). A key Redis knows completed is a duplicate (or a
   conflict, when the payload hash differs) and is acked at once; a key held
   in flight elsewhere is deferred (sent back after a short delay) rather
   than run twice; no Redis quorum means degraded mode (step 3b).
2. Take a fencing token from Postgres (`key_fences`): it also tells whether
   the key is completed — Postgres is the truth when Redis forgot.
3. In one Postgres transaction: run the handler with that transaction's
   connection as `ctx.db`, then insert the completion row, refused if our
   token is no longer the key's current one or the key is already done.
   3b. Degraded: the transaction first takes an advisory lock on the key,
   then its token, so workers still take turns on Postgres alone.
4. Tell Redis the key is done (best effort), which also frees the lock.

A handler failure rolls the transaction back, frees the lock and becomes a
retry or a dead letter (`workers.retry`). Outages of Postgres or RabbitMQ
are not failures: their exceptions leave this module, and the worker waits
for the service and runs the message again, no attempt used.
"""

import asyncio
import contextlib
from datetime import UTC, datetime

import asyncpg

from webhook_ingest.shared import metrics
from webhook_ingest.shared.idempotency import ClaimState, Outcome, classify_completed
from webhook_ingest.shared.logging import get_logger
from webhook_ingest.shared.message import EventMessage
from webhook_ingest.shared.queries import load_queries
from webhook_ingest.shared.sources import Source
from webhook_ingest.workers.handlers import Event, HandlerContext, load_handler
from webhook_ingest.workers.idempotency import Claim, IdempotencyStore
from webhook_ingest.workers.outage import outage_kind
from webhook_ingest.workers.redlock import REDIS_ERRORS, Lock
from webhook_ingest.workers.retry import FailurePolicy

log = get_logger(__name__)
SQL = load_queries("webhook_ingest.workers")
DEFER_SECONDS = 1.0
BUSY_RECHECKS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.24)  # seconds, ~0.55 in all


class CompletionRefused(Exception):
    """Our fencing token is stale, or the key completed meanwhile."""


class HandlerFailed(Exception):
    """The handler raised; the original exception is the cause."""


class AlreadyCompleted(Exception):
    def __init__(self, completed_sha256: str):
        self.completed_sha256 = completed_sha256


class Processor:
    def __init__(self, sources: dict[str, Source], store: IdempotencyStore, pool: asyncpg.Pool, failures: FailurePolicy):
        self._sources = sources
        self._handlers = {name: load_handler(source.handler) for name, source in sources.items()}
        self._store = store
        self._pool = pool
        self._failures = failures

    def batchable(self, message: EventMessage) -> bool:
        """Whether the source's handler may share a transaction (`workers.batch`)."""
        return getattr(self._handlers[message.source], "batchable", False)

    async def process(self, message: EventMessage) -> Outcome:
        return await self.process_claimed(message, await self._store.claim(message.key))

    async def process_claimed(self, message: EventMessage, claim: Claim) -> Outcome:
        if claim.state is ClaimState.COMPLETED:
            return await self.completed(message, claim.completed_sha256, redis_knows=True)
        if claim.state is ClaimState.BUSY:
            claim = await self._claim_when_free(message.key)
            if claim.state is not ClaimState.BUSY:
                return await self.process_claimed(message, claim)
            await self._failures.delay(message, DEFER_SECONDS)
            return Outcome.DEFERRED
        if claim.state is ClaimState.ACQUIRED:
            return await self.run_locked(message, claim.lock)
        return await self._run(message, locked=False)

    async def _claim_when_free(self, key: str) -> Claim:
        """Claims again a few times while the key is in flight elsewhere.

        Copies of one event arrive together; the first is usually done within
        milliseconds, and a re-claim (one SET NX) then finds it completed —
        much cheaper than a round through the retry queue. A slow handler
        still sends the copy to the retry queue after about half a second.
        """
        for pause in BUSY_RECHECKS:
            await asyncio.sleep(pause)
            claim = await self._store.claim(key)
            if claim.state is not ClaimState.BUSY:
                return claim
        return claim

    async def run_locked(self, message: EventMessage, lock: Lock) -> Outcome:
        async with self.kept_alive(lock):
            try:
                outcome = await self._run(message, locked=True)
            except BaseException:
                await _quietly(self._store.release(lock))
                raise
        if outcome is Outcome.RETRIED or outcome is Outcome.DEAD:
            await _quietly(self._store.release(lock))
        return outcome

    async def _run(self, message: EventMessage, locked: bool) -> Outcome:
        """Steps 2 to 4; `locked` False means degraded mode (no Redis lock).

        One pooled connection for the whole pass; what follows a failure
        (dead letter, conflict row) runs after it is back in the pool, so a
        full pool never waits on itself.
        """
        source = self._sources[message.source]
        try:
            async with self._pool.acquire() as connection:
                token = await self._register_fence(connection, message.key) if locked else None
                async with connection.transaction():
                    if token is None:
                        token = await self._take_turn(connection, message.key)
                    await self.call_handler(connection, message)
                    if await connection.fetchval(SQL["complete_event"], *_completion_row(message, token)) is None:
                        raise CompletionRefused()
        except AlreadyCompleted as done:
            return await self.completed(message, done.completed_sha256)
        except CompletionRefused:
            return await self._refused(message)
        except HandlerFailed as failed:
            return await self._failures.fail(message, source, failed.__cause__)
        await _quietly(self._store.complete(message.key, message.payload_sha256))
        return Outcome.PROCESSED

    async def _register_fence(self, connection, key: str) -> int:
        """Outside the transaction, so a takeover is visible to the older holder at once."""
        fence = await connection.fetchrow(SQL["acquire_fence"], key)
        if fence["completed_sha256"] is not None:
            raise AlreadyCompleted(fence["completed_sha256"])
        return fence["token"]

    async def _take_turn(self, connection, key: str) -> int:
        await connection.execute(SQL["lock_key_for_transaction"], key)
        return await self._register_fence(connection, key)

    async def call_handler(self, connection, message: EventMessage) -> None:
        source = self._sources[message.source]
        event = Event(
            source=message.source,
            event_id=message.event_id,
            key=message.key,
            headers=message.headers,
            received_at=datetime.fromtimestamp(message.received_at, UTC),
            attempt=message.attempt,
            body=message.body,
        )
        context = HandlerContext(db=connection, options=source.handler_options, logger=log)
        try:
            await self._handlers[message.source](event, context)
        except Exception as exc:
            if outage_kind(exc, in_handler=True):
                raise  # ctx.db lost its connection: Postgres is down, not the handler
            raise HandlerFailed() from exc

    async def completed(self, message: EventMessage, completed_sha256: str, redis_knows: bool = False) -> Outcome:
        outcome = classify_completed(completed_sha256, message.payload_sha256)
        if outcome is Outcome.CONFLICT:
            log.warning("payload_conflict", completed_sha256=completed_sha256, conflicting_sha256=message.payload_sha256)
            async with self._pool.acquire() as connection:
                await connection.execute(
                    SQL["record_conflict"], message.key, message.source, message.event_id,
                    completed_sha256, message.payload_sha256,
                )
        elif not redis_knows:  # Redis forgot (flushed, expired): teach it again
            await _quietly(self._store.complete(message.key, completed_sha256))
        return outcome

    async def _refused(self, message: EventMessage) -> Outcome:
        async with self._pool.acquire() as connection:
            completed_sha256 = await connection.fetchval(SQL["completed_sha256"], message.key)
        if completed_sha256 is not None:
            return await self.completed(message, completed_sha256)
        # Another worker took the key over after our lock expired; its own
        # delivery of this event completes it. Ours rolled back, harmlessly.
        log.warning("completion_refused_stale_token")
        return Outcome.SUPERSEDED

    @contextlib.asynccontextmanager
    async def kept_alive(self, *locks: Lock):
        """Extends the locks every third of their TTL while the block runs."""
        tasks = [asyncio.create_task(self._extend_forever(lock)) for lock in locks]
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _extend_forever(self, lock: Lock) -> None:
        interval = self._store.redlock.ttl_ms / 3000
        while True:
            await asyncio.sleep(interval)
            extended = await self._store.extend(lock)
            if extended is None:
                log.warning("processing_lock_lost", key=lock.key)
                metrics.idempotency_store_errors.labels("redis").inc()
                return
            lock = extended


def _completion_row(message: EventMessage, token: int) -> tuple:
    return (message.key, message.source, message.event_id, message.payload_sha256, token, message.attempt)


async def _quietly(coroutine) -> None:
    """Redis bookkeeping after the fact: Postgres already has the truth."""
    try:
        await coroutine
    except REDIS_ERRORS as exc:
        log.info("redis_bookkeeping_failed", error=str(exc))
