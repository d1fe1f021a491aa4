"""AMQP connections whose frames of one event-loop iteration leave in one send.

aiormq writes every frame as soon as its writer task takes it from the
connection's queue, and uvloop sends every write at once: each publish and
each ack was a `send` system call of its own, waking the broker each time.
Frames written in the same loop iteration (concurrent requests' publishes,
a batch's acks) are joined here and sent once, at the iteration's end
(`call_soon`): the order of the bytes is unchanged, and nothing waits
longer than the iteration. `write_eof` and `close` send what is pending
first; `drain` is flow control only (aiormq drains after every publish
frame, and flushing there would send each alone). So aiormq may count a
frame as written while it still waits here for the iteration's end; that is
safe because nothing of ours trusts a write: a publish counts once the
broker confirmed it, and an ack lost with a dying connection means a
redelivery, which the workers settle as a copy. Measured: one ingress
process, 64 connections, 10,000 requests, 30,033 write calls → 24,514
(docs/performance.md).

aiormq's public extension point is its `TransportFactory`; the two below
open the connection exactly as aiormq's own TCP and TLS factories do
(`asyncio.open_connection`'s few lines), with this writer.
"""

import asyncio
import inspect
from typing import Any

import aiormq
from aiormq.connection import TransportFactory
from yarl import URL

# aio-pika hands unknown connection arguments to aiormq only through
# `Connection.kwargs`: fail at import if an upgrade drops the parameter.
assert "transport_factory" in inspect.signature(aiormq.Connection.__init__).parameters, (
    "aiormq no longer takes a transport_factory"
)

STREAM_LIMIT = 2**16  # asyncio.open_connection's default
DEFAULT_PORTS = {"amqp": 5672, "amqps": 5671}  # aiormq sets the URL's port already; for the type checker


class CoalescingWriter(asyncio.StreamWriter):
    def __init__(
        self,
        transport: asyncio.Transport,
        protocol: asyncio.StreamReaderProtocol,
        reader: asyncio.StreamReader,
        loop: asyncio.AbstractEventLoop,
    ):
        super().__init__(transport, protocol, reader, loop)
        self._event_loop = loop
        self._unsent: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._unsent:
            self._event_loop.call_soon(self.flush)
        self._unsent.append(bytes(data))

    def writelines(self, data) -> None:  # type: ignore[no-untyped-def]
        for chunk in data:
            self.write(chunk)

    def flush(self) -> None:
        """Sends what this iteration wrote, unless the connection is closing."""
        if not self._unsent:
            return
        pending = b"".join(self._unsent)
        self._unsent.clear()
        if not self.transport.is_closing():
            super().write(pending)

    async def drain(self) -> None:
        """Flow control only, as asyncio's: waits while the transport's
        buffer is over its high-water mark, without sending this iteration's
        frames early (aiormq drains after every publish frame)."""
        await super().drain()

    def write_eof(self) -> None:
        self.flush()
        super().write_eof()

    def close(self) -> None:
        self.flush()
        super().close()


class CoalescingTransports(TransportFactory):
    """`transport_factory` for aiormq: TCP, or TLS for `amqps://`. One per
    connection; it keeps the writer it made last, so that the connection's
    socket can be aborted (aiormq keeps it to itself)."""

    def __init__(self) -> None:
        self.writer: CoalescingWriter | None = None

    def abort(self) -> None:
        """Drops the socket at once, unsent bytes and all: what ends a close
        that does not end (`shared/broker/amqp.close_within`)."""
        if self.writer is not None:
            self.writer.transport.abort()

    async def create(self, url: URL, **kwargs: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        context_provider = kwargs.pop("ssl_context_provider", None)
        ssl = await context_provider.get_context() if url.scheme == "amqps" and context_provider else None
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=STREAM_LIMIT, loop=loop)
        protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
        try:
            transport, _ = await loop.create_connection(
                lambda: protocol,
                host=url.host or "localhost",
                port=url.port or DEFAULT_PORTS[url.scheme],
                ssl=ssl,
                **kwargs,
            )
        except OSError as exc:
            raise aiormq.exceptions.AMQPConnectionError(*exc.args) from exc
        self.writer = CoalescingWriter(transport, protocol, reader, loop)  # type: ignore[arg-type]
        return reader, self.writer
