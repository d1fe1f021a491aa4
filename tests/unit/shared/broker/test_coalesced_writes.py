"""Writes of one event-loop iteration leave in one send, in order
(shared/broker/coalesced_writes.py, for AMQP; the duplicate lookup's GETs
do the same: ingress/intake/test_redis_get.py)."""

import asyncio

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
