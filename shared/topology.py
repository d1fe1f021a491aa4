"""Broker names and declarations (docs/reference.md §9), shared by ingress and workers.

Everything goes through the default exchange, addressed by queue name, so
there is no exchange to keep in step. All queues are quorum queues: they are
replicated and `at-least-once` dead-lettering (which needs `reject-publish`
overflow) means a message moving between them is never dropped.

- `NS.events`: the main queue. Its delivery limit stops a message that keeps
  killing its worker; such a message is dead-lettered to `NS.dead`.
- `NS.retry.<delay>s`: one queue per delay (a per-message TTL in a single
  queue would block at its head); expired messages return to `NS.events`.
- `NS.dead`: poison messages, drained into the `dead_letters` table.
"""

import asyncio
import contextlib

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractQueue

PUBLISH_TIMEOUT = 5.0  # seconds; a publish with no limit could hold a request or a message for ever
_QUORUM = {"x-queue-type": "quorum"}
_SAFE_DEAD_LETTERING = {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}


def events_queue(namespace: str) -> str:
    return f"{namespace}.events"


def dead_queue(namespace: str) -> str:
    return f"{namespace}.dead"


def retry_queue(namespace: str, delay_seconds: float) -> str:
    return f"{namespace}.retry.{delay_label(delay_seconds)}"


def delay_label(delay_seconds: float) -> str:
    """10 -> '10s', 0.5 -> '0.5s': the queue's name says its delay, every
    digit of it (the shortest text that reads back as the same float), so
    two delays that share a queue share its TTL. Up to six significant
    digits below 10^6 s, the same as the `:g` names of earlier releases."""
    text = repr(float(delay_seconds))
    return f"{text.removesuffix('.0')}s"


async def declare_events_queue(channel: AbstractChannel, namespace: str, delivery_limit: int) -> AbstractQueue:
    await declare_dead_queue(channel, namespace)
    return await channel.declare_queue(
        events_queue(namespace),
        durable=True,
        arguments={
            **_QUORUM,
            **_SAFE_DEAD_LETTERING,
            "x-delivery-limit": delivery_limit,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": dead_queue(namespace),
        },
    )


async def ensure_events_queue(connection: AbstractConnection, namespace: str, delivery_limit: int) -> None:
    """The events queue exists afterwards; one that exists is left as it is.

    Declared with its arguments, an existing queue created with others (a
    WEBHOOK_INGEST_DELIVERY_LIMIT changed since) fails with PRECONDITION_FAILED,
    and a publisher that insisted would never publish again. So only a queue
    that does not exist is declared, each step on a channel of its own (a
    failed declare closes its channel)."""
    probe = await connection.channel()
    try:
        await probe.declare_queue(events_queue(namespace), passive=True)
    except aio_pika.exceptions.ChannelNotFoundEntity:  # it also closed the probe channel
        declaring = await connection.channel()
        try:
            await declare_events_queue(declaring, namespace, delivery_limit)
        finally:
            await declaring.close()
    else:
        await probe.close()


async def declare_events_queue_to_consume(connection: AbstractConnection, channel: AbstractChannel, namespace: str,
                                          delivery_limit: int) -> tuple[AbstractQueue, bool]:
    """The events queue on `channel`, to consume from, and whether it has our
    arguments. Declared with them, as every worker does — unless it exists
    with others (a WEBHOOK_INGEST_DELIVERY_LIMIT changed since it was
    created): the broker refuses such a declaration (PRECONDITION_FAILED,
    closing the channel), and a worker that insisted would never consume;
    then it is used as it is, declared passively. Tried first on a channel
    of its own, as in `ensure_events_queue`."""
    probe = await connection.channel()
    try:
        await declare_events_queue(probe, namespace, delivery_limit)
    except aio_pika.exceptions.ChannelPreconditionFailed:
        await declare_dead_queue(channel, namespace)
        return await channel.declare_queue(events_queue(namespace), passive=True), False
    finally:
        with contextlib.suppress(Exception):  # noqa: BLE001 - a probe channel the broker may have closed
            await probe.close()
    return await declare_events_queue(channel, namespace, delivery_limit), True


async def declare_dead_queue(channel: AbstractChannel, namespace: str) -> AbstractQueue:
    return await channel.declare_queue(dead_queue(namespace), durable=True, arguments=dict(_QUORUM))


async def declare_retry_queue(channel: AbstractChannel, namespace: str, delay_seconds: float) -> AbstractQueue:
    return await channel.declare_queue(
        retry_queue(namespace, delay_seconds),
        durable=True,
        arguments={
            **_QUORUM,
            **_SAFE_DEAD_LETTERING,
            "x-message-ttl": int(delay_seconds * 1000),
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": events_queue(namespace),
        },
    )


async def publish(
    channel: AbstractChannel, message: aio_pika.Message, queue_name: str, timeout: float = PUBLISH_TIMEOUT
) -> None:
    """Publish through the default exchange; with a confirm-mode channel this
    returns only once the broker has the message, and raises otherwise —
    asyncio.TimeoutError after `timeout` seconds in all. The limit covers the
    whole call: aio-pika's own `timeout` starts only once a robust channel
    has its connection back, and it waits for that without a limit."""
    async with asyncio.timeout(timeout):
        await channel.default_exchange.publish(message, routing_key=queue_name, mandatory=True, timeout=timeout)
