"""GETs pipelined on one connection to one Redis, for the duplicate lookup
that every webhook request makes.

Through redis-py's pool a GET costs ~80 µs of CPU (pool lock, retry and
timeout wrappers, a drain per command); here it is a share of one `write`
(the commands of one loop iteration leave together) and a future resolved
by the reply parser, ~10 µs. Replies come back in the order the
commands were sent, so each answer goes to the oldest waiting future; one
given up on (timed out) still takes its reply, and is skipped. The
timeout is one timer for the commands of one loop iteration, set when they
leave, not an `asyncio.timeout` a GET (its context, a timer made and
cancelled for each).

Only plain TCP URLs (`redis://`, with password and database) are served
here; `connect_get` returns None for TLS or a unix socket, and the caller
uses the shared redis-py client instead.
"""

import asyncio
from collections import deque
from typing import cast

from redis.asyncio.connection import parse_url


class RedisReplyError(Exception):
    """Redis answered `-ERR …`."""


class ReplyParser:
    """RESP2 replies of GET, AUTH and SELECT (bulk strings, null, simple
    strings, errors, integers), from bytes arriving in any chunks."""

    def __init__(self):
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list:
        """Every reply completed by `data`, in order (an error is a RedisReplyError value)."""
        self._buffer += data
        replies = []
        while (reply := self._one()) is not _INCOMPLETE:
            replies.append(reply)
        return replies

    def _one(self):
        end = self._buffer.find(b"\r\n")
        if end < 0:
            return _INCOMPLETE
        kind, line = self._buffer[:1], bytes(self._buffer[1:end])
        if kind == b"$":
            length = int(line)
            if length < 0:
                del self._buffer[: end + 2]
                return None
            if len(self._buffer) < end + 2 + length + 2:
                return _INCOMPLETE
            value = bytes(self._buffer[end + 2 : end + 2 + length])
            del self._buffer[: end + 2 + length + 2]
            return value
        del self._buffer[: end + 2]
        if kind == b"+":
            return line
        if kind == b"-":
            return RedisReplyError(line.decode(errors="replace"))
        if kind == b":":
            return int(line)
        raise ConnectionError(f"unexpected Redis reply type {kind!r}")


_INCOMPLETE = object()


class _Connection(asyncio.Protocol):
    transport: asyncio.Transport  # set by connection_made, before create_connection returns us

    def __init__(self, timeout: float):
        self.waiting: deque[asyncio.Future] = deque()
        self.closed = False
        self._timeout = timeout
        self._parser = ReplyParser()
        self._unsent: list[bytes] = []  # commands of this loop iteration, written together at its end
        self._unsent_replies: list[asyncio.Future] = []  # their replies, failed together after the timeout

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            replies = self._parser.feed(data)
        except (ConnectionError, ValueError) as exc:
            self.transport.close()
            self._fail(ConnectionError(f"unreadable Redis reply: {exc}"))
            return
        for reply in replies:
            future = self.waiting.popleft()
            if not future.done():
                if isinstance(reply, RedisReplyError):
                    future.set_exception(reply)
                else:
                    future.set_result(reply)

    def connection_lost(self, exc) -> None:
        self._fail(ConnectionError(f"Redis connection lost: {exc or 'closed'}"))

    def _fail(self, error: Exception) -> None:
        self.closed = True
        while self.waiting:
            future = self.waiting.popleft()
            if not future.done():
                future.set_exception(error)

    def send(self, *args: bytes) -> asyncio.Future:
        """The reply's future: its value, or a RedisReplyError, a ConnectionError, or
        TimeoutError once the command has waited `timeout` from its write."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.waiting.append(future)
        if not self._unsent:
            loop.call_soon(self._flush, loop)
        self._unsent.append(_command(args))
        self._unsent_replies.append(future)
        return future

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        commands, replies = self._unsent, self._unsent_replies
        self._unsent, self._unsent_replies = [], []
        if not self.closed:
            self.transport.write(b"".join(commands))
        loop.call_later(self._timeout, _time_out, replies)


def _time_out(replies: list[asyncio.Future]) -> None:
    """The commands written together `timeout` ago: those still unanswered fail
    (their replies, when they come, are skipped)."""
    for future in replies:
        if not future.done():
            future.set_exception(TimeoutError("no Redis reply in time"))


def _command(args: tuple[bytes, ...]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        parts.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(parts)


class GetPipeline:
    MAX_WAITING = 10_000  # more unanswered GETs than this: the connection is stuck; start again

    def __init__(
        self,
        host: str,
        port: int,
        db: int,
        username: str | None,
        password: str | None,
        timeout: float,
        connect_timeout: float,
    ):
        self._address = (host, port)
        self._login = [*([username.encode()] if username else []), password.encode()] if password else None
        self._db = db
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._connection: _Connection | None = None
        self._connecting: asyncio.Future | None = None

    async def get(self, key: str) -> bytes | None:
        """The value, or None; raises ConnectionError, RedisReplyError or TimeoutError."""
        connection = self._connection
        if connection is None or connection.closed or len(connection.waiting) > self.MAX_WAITING:
            connection = await self._connect()
        return await connection.send(b"GET", key.encode())

    async def close(self) -> None:
        if self._connection is not None:
            self._connection.transport.close()

    async def _connect(self) -> _Connection:
        if self._connecting is None:  # one connect for every caller waiting on it
            self._connecting = asyncio.ensure_future(self._open())
        connecting = self._connecting
        try:
            return await asyncio.shield(connecting)
        finally:
            if connecting.done() and self._connecting is connecting:
                self._connecting = None

    async def _open(self) -> _Connection:
        await self.close()
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self._connect_timeout):
            _, connection = await loop.create_connection(lambda: _Connection(self._timeout), *self._address)
            try:
                if self._login:
                    await connection.send(b"AUTH", *self._login)
                if self._db:
                    await connection.send(b"SELECT", str(self._db).encode())
            except BaseException:
                connection.transport.close()
                raise
        self._connection = connection
        return connection


def connect_get(url: str, timeout: float, connect_timeout: float) -> GetPipeline | None:
    """A GetPipeline for a plain `redis://` URL (connected on first use), else None."""
    options = parse_url(url)
    if not url.startswith("redis://") or "connection_class" in options or "path" in options:
        return None
    return GetPipeline(
        options.get("host", "localhost"),
        options.get("port", 6379),
        options.get("db", 0),
        options.get("username"),
        options.get("password"),
        timeout,
        connect_timeout,
    )
