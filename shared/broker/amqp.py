"""Connections to RabbitMQ, one node or a cluster.

`AMQP_URL` may list several nodes of one cluster, comma-separated
(`amqp://u:p@rabbit-1/,amqp://u:p@rabbit-2/`). A connection tries them in
turn until one answers; a robust connection that loses its node retries it
once and then moves on to the next, round the list, for as long as it takes.
Any node serves: quorum queues are replicated and reachable from every node
of the cluster. Options in a URL's query string (`?heartbeat=…`) are read
from the node first connected to; a robust connection tries again every
second unless the URL says otherwise (`?reconnect_interval=5`).
"""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import aio_pika
from aio_pika.abc import AbstractConnection, AbstractRobustConnection
from aio_pika.robust_connection import RobustConnection
from yarl import URL

from .coalesced_writes import CoalescingTransports

# The rotation below wraps aio-pika's private reconnect step; fail at import,
# not silently at the first outage, if an upgrade renames it.
assert hasattr(RobustConnection, "_RobustConnection__connect_transport"), "aio-pika changed its reconnect step"


RECONNECT_INTERVAL = 1  # seconds between attempts (aio-pika's default, 5, is long when another node is up)
CLOSE_SECONDS = 2.0  # a goodbye to the broker (Close, Close-Ok, the socket's close); past it the socket is aborted
AFTER_ABORT_SECONDS = 1.0  # for aio-pika's close to return once the socket is gone
_finishing: set[asyncio.Future] = set()  # aiormq closes started by close_within, kept until done
_Connection = TypeVar("_Connection", bound=AbstractConnection)


def node_urls(amqp_url: str) -> list[str]:
    urls = [url.strip() for url in amqp_url.split(",") if url.strip()]
    if not urls:
        raise ValueError("AMQP_URL names no RabbitMQ node")
    return urls


async def connect(amqp_url: str, **kwargs: Any) -> AbstractConnection:
    """A plain connection (no reconnect) to the first node that answers."""
    return await _first_answering(node_urls(amqp_url), lambda url: aio_pika.connect(url, **kwargs))


async def connect_robust(amqp_url: str, timeout: float | None = None, **kwargs: Any) -> AbstractRobustConnection:
    """A reconnecting connection to the first node that answers; it moves to
    the next node when its own stops answering."""
    nodes = node_urls(amqp_url)

    async def attempt(url: str) -> AbstractRobustConnection:
        quick = {} if "reconnect_interval" in URL(url).query else {"reconnect_interval": RECONNECT_INTERVAL}
        connection = NodeRotatingConnection(URL(url), nodes=nodes, **quick, **kwargs)
        try:
            await connection.connect(timeout=timeout)
        except BaseException:
            await close_within(connection)
            raise
        return connection

    return await _first_answering(nodes, attempt)


async def _first_answering(urls: list[str], attempt: Callable[[str], Awaitable[_Connection]]) -> _Connection:
    for url in urls[:-1]:
        try:
            return await attempt(url)
        except (OSError, asyncio.TimeoutError, aio_pika.exceptions.AMQPError):
            continue
    return await attempt(urls[-1])


class NodeRotatingConnection(RobustConnection):
    def __init__(self, url: URL, *, nodes: list[str], **kwargs: Any):
        super().__init__(url, **kwargs)
        self._nodes = [URL(node) for node in nodes]
        # aio-pika passes only the arguments it knows to aiormq; this one it
        # hands on from `kwargs` as it is (shared/broker/coalesced_writes.py).
        self.kwargs["transport_factory"] = CoalescingTransports()

    async def _RobustConnection__connect_transport(self) -> None:  # aio-pika's own (mangled) name
        try:
            await super()._RobustConnection__connect_transport()  # type: ignore[misc]
        except BaseException:
            self._move_to_next_node()
            raise

    def _move_to_next_node(self) -> None:
        if len(self._nodes) > 1:
            index = self._nodes.index(self.url) if self.url in self._nodes else -1
            self.url = self._nodes[(index + 1) % len(self._nodes)]


async def close_within(connection: AbstractConnection, seconds: float = CLOSE_SECONDS) -> bool:
    """Closes `connection` politely within `seconds`, else aborts its socket;
    True when it closed in time. Cancelled, it aborts the socket too, so that
    no close is left waiting.

    aio-pika's `close()` cannot be bounded from outside. Its
    `UnderlayConnection.close` waits, in a `finally` and so also when
    cancelled, for a callback that only aiormq's `closing` future fires, and
    aiormq completes that future at the end of its own close, once its reader
    and writer have ended and the socket has closed. A socket that does not
    close (a TLS peer that never answers close_notify), or a cancellation
    that also cancels aiormq's close (aiohttp cancels every task when a second
    stop signal arrives during its cleanup; aiormq's close task, started when
    Close-Ok arrived, with them), leaves that wait without end, and no
    cancellation ends it (aio-pika issue #640; aiormq pull request #208:
    "closing" never resolved). So the close runs as a task of its own; past
    `seconds`, or cancelled, the socket is aborted and aiormq's close run
    again, which completes `closing` once its reader and writer have ended,
    and aio-pika's wait returns.
    """
    underlay = connection.transport  # aio-pika's hold on aiormq's connection; None once closed
    closing = asyncio.ensure_future(connection.close())
    try:
        await asyncio.wait({closing}, timeout=seconds)
    finally:
        if not closing.done():
            _abort(connection, underlay)
    if not closing.done():
        await asyncio.wait({closing}, timeout=AFTER_ABORT_SECONDS)
        return False
    if not closing.cancelled():
        closing.exception()  # the connection is gone either way; read, so asyncio does not log it
    return True


def _abort(connection: AbstractConnection, underlay: Any) -> None:
    transports = getattr(connection, "kwargs", {}).get("transport_factory")
    if isinstance(transports, CoalescingTransports):  # connect_robust's connections: their socket
        transports.abort()
    if underlay is not None:
        finishing = asyncio.ensure_future(underlay.connection.close())
        _finishing.add(finishing)
        finishing.add_done_callback(_finishing.discard)
