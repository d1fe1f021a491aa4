"""A Postgres front door that refuses some databases, as a managed Postgres
refuses the `postgres` maintenance database to an application's user.

It reads each client's startup message (declining TLS, so that it can),
answers a refused database with the FATAL error a real server sends
(42501, "permission denied for database"), and pipes every other connection
to the real server. It runs on the test's event loop: serve it while the
code under test runs in a subprocess or in the same loop.
"""

import asyncio
import contextlib
import struct

_SSL_REQUEST, _GSSENC_REQUEST = 80877103, 80877104


class PostgresGatekeeper:
    def __init__(self, refused: set[str], target: tuple[str, int] = ("127.0.0.1", 5432)):
        self.refused = refused
        self.target = target
        self.asked_for: list[str] = []  # every database a client asked for, in order
        self._server: asyncio.AbstractServer | None = None
        self._pipes: set[asyncio.Task] = set()

    @property
    def port(self) -> int:
        return self._server.sockets[0].getsockname()[1]

    def url_for(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    async def __aenter__(self) -> "PostgresGatekeeper":
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc) -> None:
        self._server.close()
        for task in self._pipes:
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._pipes.add(asyncio.current_task())
        try:
            startup = await _startup_message(reader, writer)
            database = _parameters(startup).get("database") or _parameters(startup).get("user", "")
            self.asked_for.append(database)
            if database in self.refused:
                writer.write(_fatal("42501", f'permission denied for database "{database}"'))
                await writer.drain()
                return
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
            upstream_writer.write(startup)
            await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self._pipes.discard(asyncio.current_task())


async def _startup_message(reader, writer) -> bytes:
    """The client's startup message, after declining TLS / GSS encryption."""
    while True:
        length, code = struct.unpack("!II", await reader.readexactly(8))
        if code in (_SSL_REQUEST, _GSSENC_REQUEST):
            writer.write(b"N")
            continue
        return struct.pack("!II", length, code) + await reader.readexactly(length - 8)


def _parameters(startup: bytes) -> dict[str, str]:
    fields = startup[8:].split(b"\0")
    return {fields[i].decode(): fields[i + 1].decode() for i in range(0, len(fields) - 1, 2) if fields[i]}


def _fatal(code: str, message: str) -> bytes:
    fields = (
        b"".join(
            kind + text.encode() + b"\0"
            for kind, text in ((b"S", "FATAL"), (b"V", "FATAL"), (b"C", code), (b"M", message))
        )
        + b"\0"
    )
    return b"E" + struct.pack("!I", len(fields) + 4) + fields


async def _pipe(reader, writer) -> None:
    with contextlib.suppress(ConnectionError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.close()
