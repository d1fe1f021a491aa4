"""The duplicate lookup's Redis client (ingress/intake/redis_get.py): its
RESP reply parser, the same replies whatever the chunks the socket delivers
them in; a GET's timeout; the GETs of one event-loop iteration in one send."""

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.unit.shared.broker.test_coalesced_writes import Transport  # a transport that records each send
from webhook_ingest.ingress.intake.redis_get import GetPipeline, RedisReplyError, ReplyParser, _Connection

REPLIES = st.one_of(
    st.none(),
    st.binary(max_size=200),
    st.sampled_from([("+", b"OK"), ("-", "ERR wrong number of arguments"), (":", 7)]),
)


def encode(reply) -> bytes:
    if reply is None:
        return b"$-1\r\n"
    if isinstance(reply, bytes):
        return b"$%d\r\n%s\r\n" % (len(reply), reply)
    kind, value = reply
    return f"{kind}{value.decode() if isinstance(value, bytes) else value}\r\n".encode()


def expected(reply):
    if isinstance(reply, tuple):
        kind, value = reply
        return {"+": value, ":": value}.get(kind, ("error", value))
    return reply


@given(st.lists(REPLIES, max_size=20), st.data())
def test_replies_come_out_whole_and_in_order_from_any_chunks(replies, data):
    stream = b"".join(encode(reply) for reply in replies)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    parser, parsed = ReplyParser(), []
    for start, end in zip([0, *cuts], [*cuts, len(stream)]):
        parsed.extend(parser.feed(stream[start:end]))
    assert [("error", str(r)) if isinstance(r, RedisReplyError) else r for r in parsed] == [
        expected(reply) for reply in replies
    ]


def test_a_value_holding_crlf_is_read_by_its_length():
    assert ReplyParser().feed(b"$6\r\na\r\nb\r\n\r\n$-1\r\n") == [b"a\r\nb\r\n", None]


async def test_a_get_unanswered_in_time_fails_and_its_late_reply_answers_no_other():
    """A GET's timeout (one timer for the GETs of a loop iteration) fails it
    with TimeoutError; its reply, arriving later, is skipped, and the next
    GET gets its own."""
    answering, served = asyncio.Event(), asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        values = iter([b"first", b"second", b"third"])
        try:
            while data := await reader.read(65536):
                for _ in range(data.count(b"$3\r\nGET\r\n")):
                    await answering.wait()
                    value = next(values)
                    writer.write(b"$%d\r\n%s\r\n" % (len(value), value))
        finally:  # its socket closed here, not by the GC in a later test (an unraisable ResourceWarning)
            writer.close()
            served.set()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    pipeline = GetPipeline("127.0.0.1", port, 0, None, None, timeout=0.05, connect_timeout=1.0)
    try:
        with pytest.raises(TimeoutError):
            await pipeline.get("k1")
        answering.set()
        assert await pipeline.get("k2") == b"second"
        assert await asyncio.gather(pipeline.get("k3")) == [b"third"]
    finally:
        await pipeline.close()
        server.close()
        await server.wait_closed()
        await asyncio.wait_for(served.wait(), 5)


async def test_redis_commands_of_one_iteration_leave_in_one_send():
    transport = Transport()
    connection = _Connection(timeout=1.0)
    connection.connection_made(transport)
    replies = [connection.send(b"GET", key) for key in (b"a", b"b")]
    await asyncio.sleep(0)
    assert transport.sent == [b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n*2\r\n$3\r\nGET\r\n$1\r\nb\r\n"]
    connection.data_received(b"$-1\r\n$1\r\nx\r\n")
    assert [await reply for reply in replies] == [None, b"x"]
