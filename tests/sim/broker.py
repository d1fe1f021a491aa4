"""RabbitMQ as the worker sees it through aio-pika, in memory.

What it keeps of the real broker: queues declared with their arguments
(the events queue's delivery limit and dead-letter target, each retry
queue's TTL that sends its messages back to the events queue), consumers
with a prefetch window, delivery tags counted per channel, `ack` (also
`multiple`), `reject` to the dead-letter target, publisher confirms, and
what a closed channel does: its unacknowledged deliveries go back to the
head of their queue, marked redelivered, their delivery count one higher
(past the limit: dead-lettered), and its publishes waiting for a confirm
are cancelled, as aiormq cancels them. A connection that drops closes its
channels; a robust one opens new ones after a while and consumes again.

An ack for a delivery the channel does not hold (a second ack, or one a
`multiple` ack already covered) is what RabbitMQ answers with
PRECONDITION_FAILED, closing the channel: here a violation too. A memory
alarm blocks publishes: they reach the queue and are confirmed only when
it ends.

Every message names its event in its headers, so the broker counts how
many messages carry each event (`carriers`): the simulation checks that an
event is settled when its last carrier goes (`Simulation.released`).
"""

import asyncio
import contextvars
from collections import Counter, deque
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from aio_pika.exceptions import ChannelInvalidStateError

from tests.sim.loop import PROCESS


@dataclass(eq=False)
class Envelope:
    """A message the broker holds."""

    body: bytes
    headers: dict[str, Any]
    message_id: str
    deliveries: int = 0  # the quorum queue's x-delivery-count

    @property
    def event(self) -> tuple[str, str]:
        return str(self.headers["x-key"]), str(self.headers["x-payload-sha256"])


@dataclass(eq=False)
class Queue:
    name: str
    ttl: float | None = None
    dead_letter_to: str | None = None
    delivery_limit: int | None = None
    ready: deque = field(default_factory=deque)
    consumers: list["Consumer"] = field(default_factory=list)


@dataclass(eq=False)
class Consumer:
    queue: Queue
    wire: "Wire"
    callback: Any
    tag: str
    unacked: int = 0


@dataclass(eq=False)
class Wire:
    """One AMQP channel as the broker knows it (a robust channel gets a new
    one at each reconnect; delivery tags start again at 1)."""

    process: str
    prefetch: int = 0
    is_closed: bool = False
    tags: count = field(default_factory=lambda: count(1))
    unacked: dict[int, tuple[Envelope, Consumer]] = field(default_factory=dict)
    publishes: set = field(default_factory=set)


class Delivery:
    """An aio-pika IncomingMessage."""

    def __init__(self, broker: "Broker", envelope: Envelope, wire: Wire, tag: int):
        self._broker, self._wire, self._processed = broker, wire, False
        self.body = envelope.body
        self.headers = {
            **envelope.headers,
            **({"x-delivery-count": envelope.deliveries} if envelope.deliveries else {}),
        }
        self.message_id = envelope.message_id
        self.delivery_tag = tag
        self.redelivered = envelope.deliveries > 0

    @property
    def channel(self) -> Wire:
        if self._wire.is_closed:
            raise ChannelInvalidStateError()
        return self._wire

    async def ack(self, multiple: bool = False) -> None:
        await self._settle("ack_multiple" if multiple else "ack")

    async def reject(self, requeue: bool = False) -> None:
        await self._settle("requeue" if requeue else "reject")

    async def _settle(self, how: str) -> None:
        from aio_pika.exceptions import MessageProcessError

        if self._processed:
            raise MessageProcessError("Message already processed", self)
        wire = self.channel  # raises when closed, as aio-pika does
        await self._broker.sim.net.hop("amqp")
        self._broker.settle(wire, self.delivery_tag, how)
        self._processed = True


class Exchange:
    """The default exchange of a channel: publish, and wait for the confirm."""

    def __init__(self, channel: "Channel"):
        self._channel = channel

    async def publish(self, message, routing_key: str, mandatory: bool = True, timeout: float | None = None) -> None:
        broker, wire = self._channel.broker, self._channel.wire
        if wire is None or wire.is_closed:
            raise ChannelInvalidStateError("channel closed while reconnecting")
        task = asyncio.current_task()
        wire.publishes.add(task)
        try:
            await broker.sim.net.hop("amqp")
            while broker.sim.loop.time() < broker.alarm_until:  # noqa: ASYNC110 - a window a later fault may extend
                await asyncio.sleep(broker.alarm_until - broker.sim.loop.time())
            broker.route(Envelope(message.body, dict(message.headers), message.message_id), routing_key)
            await broker.sim.net.hop("amqp")  # the confirm
        finally:
            wire.publishes.discard(task)


class FakeQueue:
    def __init__(self, channel: "Channel", queue: Queue):
        self._channel, self.name = channel, queue.name
        self._queue = queue

    async def consume(self, callback, **_: Any) -> str:
        await self._channel.broker.sim.net.hop("amqp")
        return self._channel.consume(self._queue, callback)

    async def cancel(self, consumer_tag: str, **_: Any) -> None:
        await self._channel.broker.sim.net.hop("amqp")
        self._channel.cancel(consumer_tag)


class Channel:
    """An aio-pika robust channel of one process."""

    def __init__(self, connection: "Connection"):
        self.broker, self._connection = connection.broker, connection
        self.wire: Wire | None = Wire(connection.process)
        self.default_exchange = Exchange(self)
        self._consuming: dict[str, tuple[Queue, Any]] = {}
        self._prefetch = 0
        self.is_closed = False

    async def set_qos(self, prefetch_count: int = 0, **_: Any) -> None:
        self._prefetch = prefetch_count
        if self.wire is not None:
            self.wire.prefetch = prefetch_count

    async def declare_queue(
        self, name: str, durable: bool = True, arguments: dict | None = None, passive: bool = False, **_: Any
    ) -> FakeQueue:
        await self.broker.sim.net.hop("amqp")
        return FakeQueue(self, self.broker.declare(name, arguments or {}))

    def consume(self, queue: Queue, callback) -> str:
        tag = f"ctag{next(self.broker.tags)}"
        self._consuming[tag] = (queue, callback)
        if self.wire is not None and not self.wire.is_closed:
            self.broker.subscribe(queue, self.wire, callback, tag)
        return tag

    def cancel(self, tag: str) -> None:
        self._consuming.pop(tag, None)
        self.broker.unsubscribe(tag)

    def drop(self) -> None:
        """The connection went: the broker takes everything back."""
        if self.wire is not None:
            self.broker.close_wire(self.wire)
            self.wire = None

    def reopen(self) -> None:
        self.wire = Wire(self._connection.process, prefetch=self._prefetch)
        for tag, (queue, callback) in self._consuming.items():
            self.broker.subscribe(queue, self.wire, callback, tag)

    async def close(self) -> None:
        self.drop()
        self.is_closed = True


class Connection:
    """An aio-pika robust connection of one process."""

    def __init__(self, broker: "Broker", process: str):
        self.broker, self.process = broker, process
        self.channels: list[Channel] = []
        self.connected = asyncio.Event()
        self.connected.set()
        self.closed = False

    async def channel(self, publisher_confirms: bool = True, on_return_raises: bool = False) -> Channel:
        await self.broker.sim.net.hop("amqp")
        channel = Channel(self)
        self.channels.append(channel)
        return channel

    def drop(self, down_for: float) -> None:
        if self.closed or not self.connected.is_set():
            return
        self.connected.clear()
        for channel in self.channels:
            channel.drop()
        self.broker.sim.loop.call_later(down_for, self._reconnect)

    def _reconnect(self) -> None:
        if self.closed:
            return
        for channel in self.channels:
            if not channel.is_closed:
                channel.reopen()
        self.connected.set()

    async def close(self) -> None:
        self.kill()

    def kill(self) -> None:
        self.closed = True
        for channel in self.channels:
            channel.drop()


class Broker:
    def __init__(self, sim):
        self.sim = sim
        self.queues: dict[str, Queue] = {}
        self.carriers: Counter = Counter()
        self.alarm_until = 0.0
        self.tags = count(1)
        self.faults: list[str] = []  # what a process did that RabbitMQ refuses
        self._consumers: dict[str, Consumer] = {}

    def declare(self, name: str, arguments: dict) -> Queue:
        if name not in self.queues:
            ttl = arguments.get("x-message-ttl")
            self.queues[name] = Queue(
                name,
                None if ttl is None else ttl / 1000,
                arguments.get("x-dead-letter-routing-key"),
                arguments.get("x-delivery-limit"),
            )
        return self.queues[name]

    def empty(self) -> bool:
        return sum(self.carriers.values()) == 0

    # -- messages in ---------------------------------------------------------

    def route(self, envelope: Envelope, routing_key: str) -> None:
        queue = self.queues[routing_key]  # mandatory: every queue we publish to is declared
        self.carriers[envelope.event] += 1
        self.sim.note("broker", "routed", envelope.event[0], f"{routing_key} {envelope.headers.get('x-attempt')}")
        self._enqueue(queue, envelope)

    def _enqueue(self, queue: Queue, envelope: Envelope, front: bool = False) -> None:
        if queue.ttl is not None:  # a retry queue: back to the events queue when its TTL ends
            assert queue.dead_letter_to is not None
            target = self.queues[queue.dead_letter_to]
            self.sim.loop.call_later(
                queue.ttl, self._expired, target, Envelope(envelope.body, envelope.headers, envelope.message_id)
            )
            return
        if front:
            queue.ready.appendleft(envelope)
        else:
            queue.ready.append(envelope)
        self._kick(queue)

    def _expired(self, target: Queue, envelope: Envelope) -> None:
        self._enqueue(target, envelope)

    # -- consumers and deliveries ---------------------------------------------

    def subscribe(self, queue: Queue, wire: Wire, callback, tag: str) -> None:
        consumer = Consumer(queue, wire, callback, tag)
        self._consumers[tag] = consumer
        queue.consumers.append(consumer)
        self._kick(queue)

    def unsubscribe(self, tag: str) -> None:
        consumer = self._consumers.pop(tag, None)
        if consumer is not None and consumer in consumer.queue.consumers:
            consumer.queue.consumers.remove(consumer)

    def _kick(self, queue: Queue) -> None:
        self.sim.loop.call_soon(self._deliver, queue)

    def _deliver(self, queue: Queue) -> None:
        while queue.ready:
            room = [
                c
                for c in queue.consumers
                if not c.wire.is_closed and (c.wire.prefetch == 0 or c.unacked < c.wire.prefetch)
            ]
            if not room:
                return
            consumer = room[0]
            queue.consumers.remove(consumer)  # round robin
            queue.consumers.append(consumer)
            envelope = queue.ready.popleft()
            if queue.delivery_limit is not None and envelope.deliveries > queue.delivery_limit:
                self._dead_letter(queue, envelope)
                continue
            tag = next(consumer.wire.tags)
            consumer.wire.unacked[tag] = (envelope, consumer)
            consumer.unacked += 1
            delivery = Delivery(self, envelope, consumer.wire, tag)
            self.sim.loop.call_later(self.sim.net.latency("amqp"), self._arrive, consumer, delivery)

    def _arrive(self, consumer: Consumer, delivery: Delivery) -> None:
        if consumer.wire.is_closed:
            return  # back in the queue already
        context = contextvars.copy_context()
        context.run(PROCESS.set, consumer.wire.process)
        self.sim.loop.create_task(consumer.callback(delivery), context=context)

    # -- settling ---------------------------------------------------------------

    def settle(self, wire: Wire, tag: int, how: str) -> None:
        if wire.is_closed:
            return  # the frame died with its channel: the broker redelivers
        if how == "ack_multiple":
            tags = [t for t in wire.unacked if t <= tag]
        else:
            tags = [tag]
        if tag not in wire.unacked:
            self.faults.append(f"{wire.process}: {how} of delivery tag {tag}, which the channel does not hold")
            self.sim.violation("ack-unknown-tag", "", self.faults[-1])
            self.close_wire(wire)
            return
        for settled in tags:
            envelope, consumer = wire.unacked.pop(settled)
            consumer.unacked -= 1
            if how == "reject":
                self._dead_letter(consumer.queue, envelope)
            elif how == "requeue":
                envelope.deliveries += 1
                self._enqueue(consumer.queue, envelope, front=True)
            else:
                self.let_go(envelope, f"{wire.process} acked it")
            self._kick(consumer.queue)

    def close_wire(self, wire: Wire) -> None:
        if wire.is_closed:
            return
        wire.is_closed = True
        for consumer in [c for c in self._consumers.values() if c.wire is wire]:
            self.unsubscribe(consumer.tag)
        for tag in sorted(wire.unacked, reverse=True):  # back to the head, in their order
            envelope, consumer = wire.unacked.pop(tag)
            envelope.deliveries += 1
            self._enqueue(consumer.queue, envelope, front=True)
        for task in list(wire.publishes):
            task.cancel()  # aiormq cancels the publishes a closed channel waits for

    def _dead_letter(self, queue: Queue, envelope: Envelope) -> None:
        target = self.queues.get(queue.dead_letter_to or "")
        if target is None:
            self.let_go(envelope, f"dropped from {queue.name}")
            return
        self.sim.note("broker", "dead-lettered", envelope.event[0], f"to {target.name}")
        self.sim.loop.call_later(self.sim.net.latency("amqp"), self.sim.drain_dead, envelope)

    def let_go(self, envelope: Envelope, why: str) -> None:
        self.carriers[envelope.event] -= 1
        self.sim.released(*envelope.event, why)
