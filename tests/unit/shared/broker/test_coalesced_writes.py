"""Writes of one event-loop iteration leave in one send, in order
(shared/broker/coalesced_writes.py for AMQP, ingress/intake/redis_get.py for the
duplicate lookup's GETs)."""

import asyncio

from webhook_ingest.ingress.intake.redis_get import _Connection
from webhook_ingest.shared.broker.coalesced_writes import CoalescingWriter


class Transport(asyncio.Transport):
    def __init__(self):
        super().__init__()
        self.sent: list[bytes] = []
        self.closing = False

    def write(self, data) -> None:
        self.sent.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def get_write_buffer_size(self) -> int:
        return 0


def writer_on(transport: Transport) -> CoalescingWriter:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    protocol.connection_made(transport)
    return CoalescingWriter(transport, protocol, reader, loop)


async def test_frames_written_in_one_iteration_leave_in_one_send_in_their_order():
    transport = Transport()
    writer = writer_on(transport)
    for frame in (b"method", b"header", bytearray(b"body")):
        writer.write(frame)
    assert transport.sent == []
    await asyncio.sleep(0)
    assert transport.sent == [b"methodheaderbody"]
    writer.write(b"next")
    await asyncio.sleep(0)
    assert transport.sent == [b"methodheaderbody", b"next"]
    writer.close()


async def test_drain_leaves_the_iterations_frames_together_and_close_sends_them_first():
    transport = Transport()
    writer = writer_on(transport)
    writer.write(b"publish-1")
    await writer.drain()  # aiormq drains after every publish frame
    writer.write(b"publish-2")
    assert transport.sent == []
    await asyncio.sleep(0)
    assert transport.sent == [b"publish-1publish-2"]
    transport.sent.clear()
    writer.write(b"open")
    await asyncio.sleep(0)
    assert transport.sent == [b"open"]
    writer.write(b"close-frame")
    writer.close()
    assert transport.sent == [b"open", b"close-frame"]
    await asyncio.sleep(0)
    assert transport.sent == [b"open", b"close-frame"]  # the scheduled flush finds nothing left


async def test_nothing_is_written_to_a_closing_connection():
    transport = Transport()
    writer = writer_on(transport)
    writer.write(b"late")
    transport.closing = True
    await asyncio.sleep(0)
    assert transport.sent == []
    writer.close()


async def test_redis_commands_of_one_iteration_leave_in_one_send():
    transport = Transport()
    connection = _Connection()
    connection.connection_made(transport)
    replies = [connection.send(b"GET", key) for key in (b"a", b"b")]
    await asyncio.sleep(0)
    assert transport.sent == [b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n*2\r\n$3\r\nGET\r\n$1\r\nb\r\n"]
    connection.data_received(b"$-1\r\n$1\r\nx\r\n")
    assert [await reply for reply in replies] == [None, b"x"]
