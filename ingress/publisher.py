"""The ingress's one connection to RabbitMQ.

A robust connection and a single confirm-mode channel shared by every
request: concurrent requests publish pipelined on it, each awaiting only its
own confirm. If the broker is down at start the ingress still serves (503 +
/readyz 503) and keeps connecting in the background.
"""

import asyncio

import aio_pika
import aiormq
from aio_pika.abc import AbstractRobustChannel, AbstractRobustConnection

from webhook_ingest.shared import topology
from webhook_ingest.shared.errors import ServiceUnavailable
from webhook_ingest.shared.logging import get_logger
from webhook_ingest.shared.message import EventMessage, to_amqp
from webhook_ingest.shared.settings import mask_url

log = get_logger(__name__)

PUBLISH_TIMEOUT = 5.0
_BROKER_ERRORS = (
    aio_pika.exceptions.AMQPError,
    aiormq.exceptions.AMQPError,
    ConnectionError,
    asyncio.TimeoutError,
    RuntimeError,  # aio-pika raises it for a channel closed while reconnecting
)


class BrokerUnavailable(ServiceUnavailable):
    """The broker did not confirm the publish."""


class Publisher:
    def __init__(self, amqp_url: str, namespace: str, delivery_limit: int, connection_name: str = "ingress"):
        self._amqp_url = amqp_url
        self._namespace = namespace
        self._delivery_limit = delivery_limit
        self._connection_name = connection_name
        self._connection: AbstractRobustConnection | None = None
        self._channel: AbstractRobustChannel | None = None
        self._connector: asyncio.Task | None = None
        self.queue_name = topology.events_queue(namespace)

    @property
    def ready(self) -> bool:
        return (
            self._channel is not None
            and not self._channel.is_closed
            and self._connection is not None
            and self._connection.connected.is_set()
        )

    @property
    def channel(self) -> AbstractRobustChannel | None:
        """The confirm-mode channel, None until connected (the admin API replays through it)."""
        return self._channel

    def start(self) -> None:
        self._connector = asyncio.create_task(self._connect_until_up(), name="broker-connect")

    async def close(self) -> None:
        if self._connector is not None:
            self._connector.cancel()
            await asyncio.gather(self._connector, return_exceptions=True)
        if self._connection is not None:
            await self._connection.close()

    async def publish(self, event: EventMessage) -> None:
        if not self.ready:
            raise BrokerUnavailable("not connected to the broker")
        try:
            await topology.publish(self._channel, to_amqp(event), self.queue_name, timeout=PUBLISH_TIMEOUT)
        except _BROKER_ERRORS as exc:
            raise BrokerUnavailable(f"{type(exc).__name__}: {exc}") from exc

    async def _connect_until_up(self) -> None:
        delay = 0.2
        while True:
            try:
                await self._connect()
                return
            except _BROKER_ERRORS + (OSError,) as exc:
                log.warning("broker_unreachable", url=mask_url(self._amqp_url), error=str(exc), retry_in=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _connect(self) -> None:
        connection = await aio_pika.connect_robust(
            self._amqp_url, client_properties={"connection_name": self._connection_name}
        )
        try:
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            await topology.declare_events_queue(channel, self._namespace, self._delivery_limit)
        except BaseException:
            await connection.close()
            raise
        self._connection, self._channel = connection, channel
        log.info("broker_connected", queue=self.queue_name)
