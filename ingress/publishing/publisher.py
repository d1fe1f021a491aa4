"""The ingress's one connection to RabbitMQ.

A robust connection and a single confirm-mode channel shared by every
request: concurrent requests publish pipelined on it, each awaiting only its
own confirm. If the broker is down at start the ingress still serves
(through the outbox) and keeps connecting in the background.

Once a publish goes unconfirmed (a timeout, a nack, a return, a dropped
connection), or too many live requests wait for their confirms at once, the
publisher says it is not `available` until a background probe gets a
confirm again, so requests meanwhile go to the outbox at once instead of
each waiting out the publish timeout (docs/design.md, "The outbox").
"""

import asyncio
import functools
import time
from collections.abc import Awaitable

import aio_pika
from aio_pika.abc import AbstractRobustChannel, AbstractRobustConnection
from aiohttp import web

from webhook_ingest.shared.broker import amqp, topology
from webhook_ingest.shared.errors import BrokerUnavailable, describe
from webhook_ingest.shared.event import EventMessage, amqp_properties, to_amqp
from webhook_ingest.shared.observability import get_logger, metrics, tracing
from webhook_ingest.shared.service_errors import BROKER_ERRORS
from webhook_ingest.shared.settings import mask_url

from .patience import Patience, until_done_or_silent

log = get_logger(__name__)

PUBLISH_TIMEOUT = 5.0
CONNECT_TIMEOUT = 10.0
CLOSE_TIMEOUT = amqp.CLOSE_SECONDS  # then the socket is aborted (shared/broker/amqp.close_within)
PROBE_FIRST_DELAY, PROBE_MAX_DELAY = 0.2, 5.0
PROBE_QUEUE_ARGUMENTS = {"x-queue-type": "quorum", "x-max-length": 1}  # overflow drops the older probe


def probe_queue(namespace: str) -> str:
    """Where the probe publishes: holds at most one message, never an event's."""
    return f"{namespace}.ingress-probe"


class GivenUp(BrokerUnavailable):
    """A live request stopped waiting for the broker's confirm."""

    def __init__(self, message: str, pending: asyncio.Future | None):
        super().__init__(message)
        self.pending = pending  # its publish, still going on (None: none was made)


class Publisher:
    def __init__(
        self,
        amqp_url: str,
        namespace: str,
        delivery_limit: int,
        connection_name: str = "ingress",
        max_waiting: int | None = None,
    ):
        self._amqp_url = amqp_url
        self._namespace = namespace
        self._delivery_limit = delivery_limit
        self._connection_name = connection_name
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractRobustChannel | None = None
        self._connector: asyncio.Task | None = None
        self._unconfirmed = False  # a publish failed; no probe confirmed since
        self._suspicion: asyncio.Future = asyncio.get_running_loop().create_future()  # done while unconfirmed
        self._prober: asyncio.Task | None = None
        self._waiting = 0  # live requests waiting for their confirm now
        self._max_waiting = max_waiting  # more, and the broker is suspect
        self._patience = Patience()  # how long the broker may be silent while a live request waits
        self._last_confirm = 0.0  # time.monotonic() of the latest confirm of a live publish
        self.queue_name = topology.events_queue(namespace)  # with one partition (WEBHOOK_INGEST_EVENT_QUEUES=1)
        self._partitioned = topology.event_queues() > 1
        self._probe_queue = probe_queue(namespace)

    @property
    def ready(self) -> bool:
        return (
            self._channel is not None
            and not self._channel.is_closed
            and self._connection is not None
            and self._connection.connected.is_set()
        )

    @property
    def available(self) -> bool:
        """Worth a publish now: connected, and confirming since the last failure."""
        return self.ready and not self._unconfirmed

    @property
    def channel(self) -> AbstractRobustChannel | None:
        """The confirm-mode channel, None until connected (the admin API replays through it)."""
        return self._channel

    @property
    def _open_channel(self) -> AbstractRobustChannel:
        if self._channel is None:
            raise ConnectionError("not connected to the broker")  # one of BROKER_ERRORS
        return self._channel

    @property
    def _open_connection(self) -> AbstractRobustConnection:
        if self._connection is None:
            raise ConnectionError("not connected to the broker")
        return self._connection

    def start(self) -> None:
        self._connector = asyncio.create_task(self._connect_until_up(), name="broker-connect")

    async def close(self) -> None:
        for task in (self._connector, self._prober):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._connection is not None and not await amqp.close_within(self._connection, CLOSE_TIMEOUT):
            log.warning("broker_close_timed_out", seconds=CLOSE_TIMEOUT)  # its socket was aborted

    async def publish(self, event: EventMessage, live: bool = False) -> None:
        """Returns once the broker confirmed. A `live` request gives up
        once the broker has confirmed nothing at all for the patience
        (`ingress/publishing/patience.py`) while it waited, or as soon as any other
        publish made the broker suspect; the publish itself goes on, and a
        late confirm only makes a copy, which the workers settle. A live
        request that would make more than `max_waiting` wait is not
        published: the broker becomes suspect. A live request given up on
        raises GivenUp, for `publish_anyway`."""
        if not self.available:
            raise GivenUp("not connected to the broker" if not self.ready else "the broker is not confirming", None)
        if live and self._crowded():
            self._suspect()
            raise GivenUp(f"{self._waiting} requests already wait for a confirm", None)
        if not live:
            return await self._confirmed(self._publish(event))
        publishing = asyncio.ensure_future(self._publish(event))
        publishing.add_done_callback(functools.partial(self._learn, time.monotonic()))
        try:
            await self._confirmed(self._within(publishing, self._patience.seconds))
        except BrokerUnavailable as exc:
            raise GivenUp(str(exc), None if publishing.done() else publishing) from exc

    async def publish_anyway(self, event: EventMessage, given_up: GivenUp) -> None:
        """The last way left (the outbox failed too): the publish given up
        on, awaited to its own limit; or, when none was made and the
        connection is up, one now, suspect broker or not. Raises
        BrokerUnavailable when that is not confirmed either."""
        if given_up.pending is not None:
            return await self._confirmed(given_up.pending)
        if not self.ready:
            raise given_up
        await self._confirmed(self._publish(event))

    def _publish(self, event: EventMessage) -> Awaitable[None]:
        """The event's publish, straight through aiormq (7 % of a request's
        instructions less than through aio-pika's message and exchange,
        docs/performance.md); through aio-pika while tracing is on, whose
        instrumentation of the exchange traces it. To its key's partition
        of the events queue, when it has several."""
        queue = topology.events_queue_for(self._namespace, event.key) if self._partitioned else self.queue_name
        if tracing.is_on():
            return topology.publish(self._open_channel, to_amqp(event), queue, timeout=PUBLISH_TIMEOUT)
        return topology.publish_properties(
            self._open_channel, event.body, amqp_properties(event), queue, timeout=PUBLISH_TIMEOUT
        )

    async def _confirmed(self, publishing: Awaitable[None]) -> None:
        try:
            await publishing
        except BROKER_ERRORS as exc:
            self._suspect()
            raise BrokerUnavailable(describe(exc)) from exc

    def _crowded(self) -> bool:
        return self._max_waiting is not None and self._waiting >= self._max_waiting

    async def _within(self, publishing: asyncio.Future, patience: float) -> None:
        self._waiting += 1
        try:
            await until_done_or_silent(publishing, self._suspicion, patience, lambda: self._last_confirm)
        finally:
            self._waiting -= 1
        if publishing.done():
            return publishing.result()
        publishing.add_done_callback(_ignore_outcome)
        raise asyncio.TimeoutError(
            f"no confirm for {patience * 1000:.0f} ms"
            if not self._suspicion.done()
            else "another publish went unconfirmed"
        )

    def _learn(self, started: float, publishing: asyncio.Future) -> None:
        """Every confirm of a live publish teaches the patience, also one
        that came after its request gave up: learning only from confirms
        within the patience, a broker whose confirms became slower than four
        times the recent ones (a farther node, a slower disk) would never
        teach a longer wait, and every request would go to the outbox for as
        long as it stayed so."""
        if not publishing.cancelled() and publishing.exception() is None:
            self._last_confirm = time.monotonic()
            self._patience.confirmed_after(self._last_confirm - started)

    def _suspect(self) -> None:
        if not self._unconfirmed:
            metrics.broker_suspected.inc()
        self._unconfirmed = True
        if not self._suspicion.done():
            self._suspicion.set_result(None)  # wakes every publish still waiting with patience
        if self._prober is None or self._prober.done():
            self._prober = asyncio.create_task(self._probe_until_confirmed(), name="broker-probe")

    async def _probe_until_confirmed(self) -> None:
        delay = PROBE_FIRST_DELAY
        while not (self.ready and await self._probe()):
            await asyncio.sleep(delay)
            delay = min(delay * 2, PROBE_MAX_DELAY)
        self._unconfirmed = False
        self._suspicion = asyncio.get_running_loop().create_future()
        log.info("broker_confirming", queue=self.queue_name)

    async def _probe(self) -> bool:
        """Re-declare the events queue (deleted under us, a return says so),
        then publish to the probe queue: a quorum queue on the same nodes,
        holding at most one message, so a confirm proves that publishes get
        through (no alarm, no stall, a quorum of nodes up) while the probes
        pile up nowhere."""
        try:
            await asyncio.wait_for(
                topology.ensure_events_queue(self._open_connection, self._namespace, self._delivery_limit),
                PUBLISH_TIMEOUT,
            )
            await asyncio.wait_for(
                self._open_channel.declare_queue(self._probe_queue, durable=True, arguments=PROBE_QUEUE_ARGUMENTS),
                PUBLISH_TIMEOUT,
            )
            await asyncio.wait_for(
                self._open_channel.default_exchange.publish(  # bounded also while reconnecting
                    aio_pika.Message(b""), routing_key=self._probe_queue, timeout=PUBLISH_TIMEOUT
                ),
                PUBLISH_TIMEOUT,
            )
        except BROKER_ERRORS as exc:
            log.info("broker_probe_failed", error=describe(exc))
            return False
        return True

    async def _connect_until_up(self) -> None:
        delay = 0.2
        while True:
            try:
                await asyncio.wait_for(self._connect(), CONNECT_TIMEOUT)  # a hung broker: try again
                return
            except BROKER_ERRORS as exc:
                log.warning("broker_unreachable", url=mask_url(self._amqp_url), error=str(exc), retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _connect(self) -> None:
        connection = await amqp.connect_robust(
            self._amqp_url, client_properties={"connection_name": self._connection_name}
        )
        try:
            await topology.ensure_events_queue(connection, self._namespace, self._delivery_limit)
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            await topology.declare_ordering_queue(channel, self._namespace)  # wake-ups (ingress/intake/ordered.py)
        except BaseException:
            await amqp.close_within(connection, CLOSE_TIMEOUT)
            raise
        self._connection, self._channel = connection, channel
        log.info("broker_connected", queue=self.queue_name)


def _ignore_outcome(publishing: asyncio.Future) -> None:
    """A publish nobody waits for any more: its outcome is only read, so
    asyncio does not log it as never retrieved."""
    if not publishing.cancelled():
        publishing.exception()


publisher_key = web.AppKey("publisher", Publisher)
