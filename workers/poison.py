"""Drain `NS.dead` into the dead-letter store.

A message lands in `NS.dead` when the main quorum queue's delivery limit
stopped it: it was delivered again and again and never acknowledged, because
its handler keeps killing the worker process (a crash, the OOM killer). A
worker that cannot read a message rejects it there too. Each one becomes a
`dead_letters` row, and only then is it acknowledged: never dropped, even
when it is not an event message at all.

If Postgres is down the message waits, unacknowledged, and recording is
retried until it succeeds (the dead queue is no place for a requeue loop).
A crash between the commit and the ack records nothing new on its
redelivery: the event's open dead letter is found again.

A worker that dies takes the acks of its other messages with it, so they
are redelivered beside the poison one and may reach the limit too; one
whose event has completed (same key, payload and event id) is acked
without a dead letter. The event id is what tells event evt_a#billing
from event evt_a's route billing, whose key it shares (docs/design.md,
"Routes"): the route's completion does not make the plain event's. For
the same reason a routed source's own event (no route) hands no attempt
on: it never runs under its key, which is a route's.
"""

import asyncio
import hashlib
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial

from aio_pika.abc import AbstractChannel, AbstractIncomingMessage, AbstractQueue

from webhook_ingest.shared import backoff
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.dead_letters import UNREADABLE, record_dead_letter
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.event import EventMessage, from_amqp
from webhook_ingest.shared.observability import get_logger, metrics
from webhook_ingest.workers.claim import CompletionStore

log = get_logger(__name__)

UNKNOWN_SOURCE = "unknown"
MAX_RETRY_DELAY = 10.0
POISON_PREFETCH = 8  # dead messages are rare; each is one Postgres write
_HEADER_CHARS = 500


@dataclass(frozen=True)
class PoisonConsumer:
    queue: AbstractQueue
    consumer_tag: str


async def drain_poison_queue(
    channel: AbstractChannel,
    pool,
    namespace: str,
    delivery_limit: int | None = None,
    routed_sources: frozenset[str] = frozenset(),
) -> PoisonConsumer:
    """Start consuming `NS.dead` on `channel`, for as long as the channel lives.
    The channel is the drainer's own: a worker's batches settle the consume
    channel's deliveries with one `multiple` ack (`workers.acks`), which
    must never cover a dead message before it is recorded.
    `delivery_limit` (the events queue's) only makes the recorded error precise;
    `routed_sources` are the sources with routes (`_hands_on`)."""
    await channel.set_qos(prefetch_count=POISON_PREFETCH)
    queue = await topology.declare_dead_queue(channel, namespace)
    consumer_tag = await queue.consume(partial(_on_poison_message, pool, delivery_limit, routed_sources))
    log.info("poison_drain_started", queue=queue.name)
    return PoisonConsumer(queue, consumer_tag)


async def stop_draining(consumer: PoisonConsumer) -> None:
    """Stop taking messages; those being recorded are still acked or, if the
    channel closes first, redelivered."""
    await consumer.queue.cancel(consumer.consumer_tag)


async def _on_poison_message(
    pool, delivery_limit: int | None, routed_sources: frozenset[str], message: AbstractIncomingMessage
) -> None:
    event, errors = poison_record(message, delivery_limit)
    dead_letter_id = await _record_until_stored(pool, event, errors, _hands_on(event, errors, routed_sources))
    await message.ack()
    if dead_letter_id is None:
        log.info("poison_message_already_completed", source=event.source, key=event.key)
        return
    metrics.events.labels(event.source, "dead").inc()
    log.error(
        "poison_message_recorded",
        source=event.source,
        key=event.key,
        attempt=event.attempt,
        dead_letter_id=dead_letter_id,
        error_type=errors[-1]["type"],
    )


def poison_record(message: AbstractIncomingMessage, delivery_limit: int | None) -> tuple[EventMessage, list[dict]]:
    """The event and its error history, whatever the message holds."""
    headers = message.headers or {}
    try:
        event = from_amqp(message.body, headers)
    except (KeyError, ValueError, TypeError) as exc:
        event = unreadable_event(message)
        return event, [_error(event.attempt, UNREADABLE, f"not an event message of webhook-ingest ({describe(exc)})")]
    return event, [
        *event.errors,
        _error(event.attempt, "DeliveryLimitExceeded", delivery_limit_message(delivery_limit)),
    ]


def delivery_limit_message(delivery_limit: int | None) -> str:
    # RabbitMQ does not carry the original delivery count over to the dead
    # queue (its x-delivery-count there counts deliveries from NS.dead).
    times = f"more than {delivery_limit} times" if delivery_limit else "repeatedly"
    return f"delivery limit exceeded (the message was delivered {times} without being acknowledged)"


def unreadable_event(message: AbstractIncomingMessage) -> EventMessage:
    """A stand-in for a message we did not write, so it is kept all the same."""
    message_id = message.message_id or uuid.uuid4().hex
    return EventMessage(
        key=f"{UNKNOWN_SOURCE}:{message_id}",
        source=UNKNOWN_SOURCE,
        event_id=message_id,
        payload_sha256=hashlib.sha256(message.body).hexdigest(),
        received_at=message.timestamp.timestamp() if message.timestamp else time.time(),
        body=message.body,
        headers={str(name): str(value)[:_HEADER_CHARS] for name, value in (message.headers or {}).items()},
    )


def _error(attempt: int, kind: str, text: str) -> dict:
    return {"attempt": attempt, "at": datetime.now(UTC).isoformat(), "type": kind, "message": text}


def _hands_on(event: EventMessage, errors: list[dict], routed_sources: frozenset[str]) -> bool:
    """Whether the dead letter hands the event's attempt on (`workers.claim.attempts`):
    not an unreadable message's, nor a routed source's own event's — that
    event is only ever fanned out, and its key, `KEY#ROUTE` when its id ends
    so, may be a route's, whose next attempt it would turn into a copy."""
    return errors[-1]["type"] != UNREADABLE and not (not event.route and event.source in routed_sources)


async def _record_until_stored(pool, event: EventMessage, errors: list[dict], hand_on: bool) -> int | None:
    """The dead letter's id; None, recording nothing, when the event was
    completed: a message delivered beside a poison one to the worker it
    killed, whose ack died with that worker (`record_dead_letter` checks,
    by key, payload and event id).

    An event's attempt that ends here is handed on to its dead letter, as
    one a handler failed (`workers.claim.attempts`): a copy of it (the provider
    sending the event again) is then a duplicate while the dead letter is
    open, instead of a new round of crashes up to the delivery limit."""
    pauses = backoff.pauses(0.5, MAX_RETRY_DELAY)
    completions = CompletionStore(pool)
    while True:
        try:
            async with pool.acquire(timeout=10) as connection:  # a session that died unseen: dropped on release
                dead_letter_id = await record_dead_letter(connection, event, errors, timeout=10)
            break
        except Exception as exc:  # noqa: BLE001 - never drop it: wait and try again
            metrics.dead_letter_record_failures.inc()
            pause = next(pauses)
            log.warning("poison_record_failed", key=event.key, error=describe(exc), retry_in=pause)
            await asyncio.sleep(pause)
    if dead_letter_id is not None and hand_on:  # after its connection is back in the pool
        await completions.record_handed_on(event)
    return dead_letter_id
