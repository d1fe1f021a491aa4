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
- `NS.paused.<source>`: a paused source's events, parked until it is
  resumed; then moved back to `NS.events`, oldest first (workers/pauses.py).
- `NS.events.0` … `NS.events.{N-1}`: the events queue in N partitions
  instead, with WEBHOOK_INGEST_EVENT_QUEUES=N > 1 (`set_event_queues`):
  an event goes to the partition of its key (`partition_of`), every worker
  consumes them all; each has its retry queues, `NS.retry.<delay>s.<n>`,
  which return to it. One quorum queue's leader is one Erlang process,
  on one core of one node; N of them spread over a cluster's nodes
  (docs/operations.md, "Past one machine").
- `NS.ordering`: wake-ups of ordering keys' lanes (issue 38), each only its
  lane (`x-lane`), empty body: the events wait in Postgres
  (shared/ordering/), a wake-up is a hint, acked at once.
"""

import asyncio
import contextlib
import os
import zlib

import aio_pika
import aiormq
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractQueue
from pamqp.commands import Basic

from . import amqp

DEPTH_TIMEOUT = 3.0  # seconds, to connect and to ask for one queue's depth
PUBLISH_TIMEOUT = 5.0  # seconds; a publish with no limit could hold a request or a message for ever
_QUORUM = {"x-queue-type": "quorum"}
WAKE_LANE_HEADER = "x-lane"
_SAFE_DEAD_LETTERING = {"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"}


_event_queues = 1  # the events queue's partitions; the process's one setting (set_event_queues)


def set_event_queues(count: int) -> None:
    """The events queue's partitions (WEBHOOK_INGEST_EVENT_QUEUES), set once by
    each process from its settings (every CLI command as it reads them, so
    the ingress, the workers and `run`'s children; `create_app` too): like
    the namespace, one deployment's every process must agree on it."""
    global _event_queues
    if count < 1:
        raise ValueError(f"the events queue's partitions must be at least 1, not {count}")
    _event_queues = count


def event_queues() -> int:
    return _event_queues


def partition_of(key: str, partitions: int) -> int | None:
    """The partition of an event's key: crc32 of its UTF-8, mod `partitions`
    — stable across processes, releases and machines (Python's `hash` is
    salted per process). None when there is one queue: `NS.events` itself."""
    if partitions == 1:
        return None
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % partitions


def events_queue(namespace: str, partition: int | None = None) -> str:
    """`NS.events`, or its partition `NS.events.<n>`."""
    return f"{namespace}.events" if partition is None else f"{namespace}.events.{partition}"


def partitions(count: int | None = None) -> list[int | None]:
    """The events queue's partitions: [None] for the one `NS.events`."""
    count = _event_queues if count is None else count
    return [None] if count == 1 else list(range(count))


def events_queues(namespace: str, count: int | None = None) -> list[str]:
    """Every events queue: `NS.events`, or `NS.events.0` … `NS.events.{N-1}`."""
    return [events_queue(namespace, partition) for partition in partitions(count)]


def events_queue_for(namespace: str, key: str) -> str:
    """Where an event of `key` is published (by every publisher: the ingress,
    its outbox relay, the replays, a resumed source, a fan-out)."""
    return events_queue(namespace, partition_of(key, _event_queues))


def dead_queue(namespace: str) -> str:
    return f"{namespace}.dead"


def retry_queue(namespace: str, delay_seconds: float, partition: int | None = None) -> str:
    """`NS.retry.<delay>s`, or partition n's own `NS.retry.<delay>s.<n>`: a
    retry queue's dead-lettering has one routing key, its events queue."""
    name = f"{namespace}.retry.{delay_label(delay_seconds)}"
    return name if partition is None else f"{name}.{partition}"


def retry_queue_for(namespace: str, delay_seconds: float, key: str) -> str:
    """The retry queue that returns an event of `key` to its partition."""
    return retry_queue(namespace, delay_seconds, partition_of(key, _event_queues))


def paused_queue(namespace: str, source: str) -> str:
    return f"{namespace}.paused.{source}"


def ordering_queue(namespace: str) -> str:
    return f"{namespace}.ordering"


def delay_label(delay_seconds: float) -> str:
    """10 -> '10s', 0.5 -> '0.5s': the queue's name says its delay, every
    digit of it (the shortest text that reads back as the same float), so
    two delays that share a queue share its TTL. Up to six significant
    digits below 10^6 s, the same as the `:g` names of earlier releases."""
    text = repr(float(delay_seconds))
    return f"{text.removesuffix('.0')}s"


async def declare_events_queue(
    channel: AbstractChannel, namespace: str, delivery_limit: int, partition: int | None = None
) -> AbstractQueue:
    await declare_dead_queue(channel, namespace)
    return await channel.declare_queue(
        events_queue(namespace, partition),
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
    """The events queue (each partition) exists afterwards; one that exists is left as it is.

    Declared with its arguments, an existing queue created with others (a
    WEBHOOK_INGEST_DELIVERY_LIMIT changed since) fails with PRECONDITION_FAILED,
    and a publisher that insisted would never publish again. So only a queue
    that does not exist is declared, each step on a channel of its own (a
    failed declare closes its channel)."""
    for partition in partitions():
        probe = await connection.channel()
        try:
            await probe.declare_queue(events_queue(namespace, partition), passive=True)
        except aio_pika.exceptions.ChannelNotFoundEntity:  # it also closed the probe channel
            declaring = await connection.channel()
            try:
                await declare_events_queue(declaring, namespace, delivery_limit, partition)
            finally:
                await declaring.close()
        else:
            await probe.close()


async def declare_events_queue_to_consume(
    connection: AbstractConnection,
    channel: AbstractChannel,
    namespace: str,
    delivery_limit: int,
    partition: int | None = None,
) -> tuple[AbstractQueue, bool]:
    """The events queue on `channel`, to consume from, and whether it has our
    arguments. Declared with them, as every worker does — unless it exists
    with others (a WEBHOOK_INGEST_DELIVERY_LIMIT changed since it was
    created): the broker refuses such a declaration (PRECONDITION_FAILED,
    closing the channel), and a worker that insisted would never consume;
    then it is used as it is, declared passively. Tried first on a channel
    of its own, as in `ensure_events_queue`."""
    probe = await connection.channel()
    try:
        await declare_events_queue(probe, namespace, delivery_limit, partition)
    except aio_pika.exceptions.ChannelPreconditionFailed:
        await declare_dead_queue(channel, namespace)
        return await channel.declare_queue(events_queue(namespace, partition), passive=True), False
    finally:
        with contextlib.suppress(Exception):  # a probe channel the broker may have closed
            await probe.close()
    return await declare_events_queue(channel, namespace, delivery_limit, partition), True


async def declare_dead_queue(channel: AbstractChannel, namespace: str) -> AbstractQueue:
    return await channel.declare_queue(dead_queue(namespace), durable=True, arguments=dict(_QUORUM))


async def declare_paused_queue(channel: AbstractChannel, namespace: str, source: str) -> AbstractQueue:
    return await channel.declare_queue(paused_queue(namespace, source), durable=True, arguments=dict(_QUORUM))


async def declare_ordering_queue(channel: AbstractChannel, namespace: str) -> AbstractQueue:
    return await channel.declare_queue(ordering_queue(namespace), durable=True, arguments=dict(_QUORUM))


async def publish_wake(channel: AbstractChannel, namespace: str, lane: str, timeout: float = PUBLISH_TIMEOUT) -> None:
    """Wakes the workers for `lane`: one message in NS.ordering, its lane in
    `x-lane`. Raises as `publish` does; a lost wake-up only waits for a
    worker's watchdog (its next second)."""
    message = aio_pika.Message(body=b"", headers={WAKE_LANE_HEADER: lane}, message_id=os.urandom(16).hex())
    await publish(channel, message, ordering_queue(namespace), timeout)


def woken_lane(message: aio_pika.abc.AbstractIncomingMessage) -> str | None:
    """The lane a wake-up names; None for a message that is not one."""
    lane = (message.headers or {}).get(WAKE_LANE_HEADER)
    if isinstance(lane, bytes):
        lane = lane.decode()
    return lane if isinstance(lane, str) and lane else None


async def declare_retry_queue(
    channel: AbstractChannel, namespace: str, delay_seconds: float, partition: int | None = None
) -> AbstractQueue:
    return await channel.declare_queue(
        retry_queue(namespace, delay_seconds, partition),
        durable=True,
        arguments={
            **_QUORUM,
            **_SAFE_DEAD_LETTERING,
            "x-message-ttl": int(delay_seconds * 1000),
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": events_queue(namespace, partition),
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
    async with asyncio.timeout(timeout):  # the only limit: aio-pika's would be a second timer per publish
        await channel.default_exchange.publish(message, routing_key=queue_name, mandatory=True)


async def publish_properties(
    channel: AbstractChannel,
    body: bytes,
    properties: Basic.Properties,
    queue_name: str,
    timeout: float = PUBLISH_TIMEOUT,
) -> None:
    """`publish` without aio-pika's message and exchange: the same frames
    through the channel's aiormq channel, with the same guarantees — once
    the broker confirmed; a return (unroutable, mandatory) or a nack raises;
    one time limit over the whole call, the wait for a reconnecting robust
    connection included (`get_underlay_channel`)."""
    async with asyncio.timeout(timeout):
        if channel.is_closed:  # as aio-pika's exchange refuses it
            raise aiormq.exceptions.ChannelInvalidStateError(f"{channel!r} closed")
        underlay = await channel.get_underlay_channel()
        await underlay.basic_publish(body, routing_key=queue_name, properties=properties, mandatory=True)


async def queue_depths(amqp_url: str, names: list[str], connection_name: str) -> list[tuple[str, int | None]]:
    """Each queue's ready messages; None when the broker is away or the queue
    does not exist yet. A connection of its own: a passive declare of a
    missing queue closes its channel, which must never be the ingress's."""
    depths: dict[str, int | None] = dict.fromkeys(names)
    with contextlib.suppress(Exception):  # the broker away: every depth n/a
        connection = await amqp.connect(
            amqp_url, timeout=DEPTH_TIMEOUT, client_properties={"connection_name": connection_name}
        )
        async with connection:
            for name in names:
                depths[name] = await _depth(connection, name)
    return list(depths.items())


async def _depth(connection: AbstractConnection, name: str) -> int | None:
    try:
        channel = await connection.channel()
        queue = await asyncio.wait_for(channel.declare_queue(name, passive=True), DEPTH_TIMEOUT)
    except (aio_pika.exceptions.ChannelClosed, asyncio.TimeoutError):
        return None
    count = queue.declaration_result.message_count
    await channel.close()
    return count
