"""What a failed attempt becomes: a delayed retry through RabbitMQ, or a dead letter.

The delay is a TTL queue per delay level, never a sleeping worker. The
caller acks the original only after this returns, i.e. after the broker
confirmed the retry message or Postgres committed the dead letter; a crash
in between can duplicate a retry message, never an effect, and a worker
takes such a duplicate for the copy it is (`workers.claim.attempts`).
"""

import asyncio
import traceback
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime

import asyncpg

from webhook_ingest.shared.backoff import pauses
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.dead_letters import record_dead_letter
from webhook_ingest.shared.errors import describe, redacted
from webhook_ingest.shared.event import EventMessage, to_amqp
from webhook_ingest.shared.incidents import Failure, record_failure
from webhook_ingest.shared.observability import get_logger, tracing
from webhook_ingest.shared.sources import Source
from webhook_ingest.workers.failures import BROKER_LOST, POSTGRES_LOST, IncidentCounts
from webhook_ingest.workers.handlers import PermanentError

from .states import Outcome

log = get_logger(__name__)

BROKER_NOT_CONFIRMING = (*BROKER_LOST, asyncio.TimeoutError, ConnectionError, RuntimeError)
TRACEBACK_LINES = 12
MESSAGE_CHARS = 2000


def describe_failure(exc: BaseException, attempt: int) -> dict:
    """A failed attempt as stored (dead letters, incidents, the archive) and
    logged: its message and traceback redacted (shared/errors.py)."""
    lines = traceback.format_exception(exc)
    return {
        "attempt": attempt,
        "at": datetime.now(UTC).isoformat(),
        "type": type(exc).__name__,
        "message": redacted(str(exc))[:MESSAGE_CHARS],
        "traceback": redacted("".join(lines[-TRACEBACK_LINES:])),
    }


def failure_of(event: EventMessage, handler: str, error: dict, dead_letter_id: int | None = None) -> Failure:
    return Failure(
        event.source, handler, event.key, event.event_id, event.attempt, error["type"], error["message"], dead_letter_id
    )


def retry_decision(event: EventMessage, source: Source, exc: BaseException) -> float | None:
    """Seconds before the next attempt, or None: a dead letter now."""
    if isinstance(exc, PermanentError) or event.attempt >= source.max_attempts:
        return None
    return source.retry_delay(event.attempt)


class FailurePolicy:
    def __init__(self, channel, pool, namespace: str, counts: IncidentCounts | None = None):
        self._channel = channel  # confirm-mode
        self._pool = pool
        self._namespace = namespace
        self._counts = counts  # where retries are counted in their incidents; None: not counted

    async def fail(self, event: EventMessage, source: Source, exc: BaseException) -> Outcome:
        error = describe_failure(exc, event.attempt) | tracing.trace_ids(event)  # on-call's way to its trace
        retry_in = retry_decision(event, source, exc)
        if retry_in is None:
            dead_letter_id = await self.dead_letter(
                event, error, permanent=isinstance(exc, PermanentError), handler=source.handler_for(event.route)[0]
            )
            return Outcome.DEAD if dead_letter_id is not None else Outcome.DUPLICATE  # None: completed meanwhile
        await self.delay(event.next_attempt(error), retry_in)
        log.warning("event_retry_scheduled", retry_in=retry_in, error_type=error["type"], error=error["message"][:200])
        if self._counts is not None:
            self._counts.note(failure_of(event, source.handler_for(event.route)[0], error))
        return Outcome.RETRIED

    async def dead_letter(
        self,
        event: EventMessage,
        error: dict,
        permanent: bool = False,
        handler: str = "",
        beside: Callable[[asyncpg.Connection, int], Awaitable[object]] | None = None,
    ) -> int | None:
        """Records the event with its whole error history, counted in its
        incident; returns only once committed, waiting while Postgres is
        away (not running the handler again). A count Postgres refuses
        does not refuse the dead letter (`_counted_beside`). `beside`, given
        the connection and the dead letter's id, writes in the same
        transaction (an ordered row kept dead, its lane blocked: workers/ordering)."""
        for pause in pauses():
            try:
                async with self._pool.acquire(timeout=10) as connection, connection.transaction():
                    # bounded: a session that died unseen is dropped by the pool's release
                    dead_letter_id = await record_dead_letter(connection, event, (*event.errors, error), timeout=10)
                    if dead_letter_id is not None:
                        if beside is not None:
                            await beside(connection, dead_letter_id)
                        await _counted_beside(connection, failure_of(event, handler, error, dead_letter_id))
                break
            except (*POSTGRES_LOST, OSError, asyncio.TimeoutError) as exc:
                log.warning("dead_letter_waiting_for_postgres", error=describe(exc), retry_in=pause)
                await asyncio.sleep(pause)
        log.error(
            "event_dead_lettered",
            dead_letter_id=dead_letter_id,
            error_type=error["type"],
            error=error["message"][:200],
            permanent=permanent,
        )
        return dead_letter_id

    async def delay(self, event: EventMessage, delay_seconds: float) -> None:
        """Publish `event` to come back to the main queue after `delay_seconds`.

        Returns once the broker confirmed it, holding the original message
        meanwhile: the handler already ran, and running it again because a
        publish failed would repeat its external effects. A publish that is
        not confirmed in time is waited for further, not repeated: it may
        still reach the broker (one blocked by an alarm takes it later), and
        a second one would be a second retry chain. Only when the channel
        died — its publish's fate unknown — is it published again
        (`workers.claim.attempts` makes a copy that got through harmless).
        """
        await self.publish_to(event, topology.retry_queue_for(self._namespace, delay_seconds, event.key))

    async def publish_to(self, event: EventMessage, queue_name: str) -> None:
        """`event` on `queue_name`, waited for as `delay` waits (its docstring
        says why); in the event's own trace, whichever task publishes it."""
        with tracing.continued(event):
            for pause in pauses():
                try:
                    await self._confirmed(to_amqp(event), queue_name)
                    return
                except BROKER_NOT_CONFIRMING as exc:
                    log.warning("broker_publish_failed", queue=queue_name, error=describe(exc), retry_in=pause)
                    await asyncio.sleep(pause)

    async def _confirmed(self, message, queue_name: str) -> None:
        """One publish, waited for until the broker confirms it or its channel dies."""
        publishing = asyncio.ensure_future(
            self._channel.default_exchange.publish(message, routing_key=queue_name, mandatory=True)
        )
        try:
            while True:
                done, _ = await asyncio.wait([publishing], timeout=topology.PUBLISH_TIMEOUT)
                if done and publishing.cancelled():  # aiormq cancels its publishes when the channel closes
                    raise ConnectionError("the channel closed before the broker confirmed")
                if done:
                    publishing.result()  # raises when the broker refused it (a nack, a return)
                    return
                log.warning("broker_publish_waiting", queue=queue_name, waited_s=topology.PUBLISH_TIMEOUT)
        finally:
            publishing.cancel()  # only when we are cancelled (a shutdown): the message is redelivered


async def _counted_beside(connection, failure: Failure) -> None:
    """A dead letter's count in its incident, in the dead letter's transaction
    (its own savepoint) — unless Postgres refuses the count itself (not an
    outage, which the caller waits out): then the dead letter commits
    without it. The dead letter is the event's state; the count is for
    reading, and a refusal that comes back every time would otherwise send
    the event round the delivery limit, its handler run each time."""
    try:
        await record_failure(connection, failure, timeout=10)
    except asyncpg.PostgresError as exc:
        if isinstance(exc, POSTGRES_LOST):
            raise
        log.warning("incident_count_skipped", error=describe(exc))
