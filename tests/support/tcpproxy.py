"""A TCP proxy a test can cut and restore, to make a real outage of a real
service without stopping the shared one.

Runs in its own thread with its own event loop, so it keeps forwarding while
the test's loop is busy, and can serve processes the test starts.
"""

import asyncio
import socket
import threading
import weakref


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TcpProxy:
    def __init__(self, target_host: str, target_port: int, listen_port: int | None = None, latency: float = 0.0):
        self.target = (target_host, target_port)
        self.latency = latency  # seconds each chunk takes to reach the service (a distant server)
        self.port = listen_port or free_port()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()  # a cut drops these
        self._made: weakref.WeakSet[asyncio.StreamWriter] = weakref.WeakSet()  # every socket of ours not gone yet
        self._tasks: set[asyncio.Task] = set()  # _serve's, one a connection
        self._stopping = False
        self._flowing = asyncio.Event()  # cleared: bytes wait, connections stay open
        self._flowing.set()
        self._pairs: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()  # (client, upstream)
        self._orphaned: set[asyncio.StreamWriter] = set()  # client sides never told their peer is gone
        self._held = 0  # chunks read while stalled, not forwarded yet
        self._connections = 0  # accepted, ever
        self._cuts = 0

    def url_for(self, url: str) -> str:
        """`url` with its host:port replaced by the proxy's."""
        host_port = f"{self.target[0]}:{self.target[1]}"
        assert host_port in url, (host_port, url)
        return url.replace(host_port, f"127.0.0.1:{self.port}")

    def start(self) -> "TcpProxy":
        self._thread.start()
        self.restore()
        return self

    def cut(self) -> None:
        """Refuse new connections and drop the open ones."""
        self._call(self._cut())

    def restore(self) -> None:
        self._call(self._listen())

    def stall(self) -> None:
        """Keep the connections open but forward nothing: a hung peer (a
        broker blocked by an alarm looks like this to a publisher)."""
        self._loop.call_soon_threadsafe(self._flowing.clear)

    def flow(self) -> None:
        self._loop.call_soon_threadsafe(self._flowing.set)

    def holding(self) -> int:
        """Chunks stall() keeps back: something a client sent into the black
        hole (a statement waiting for its answer)."""
        return self._held

    def connections(self) -> int:
        """Connections accepted since start, forwarded or not: while
        stalled, each is a client waiting its timeout for an answer that
        does not come."""
        return self._connections

    def orphan(self) -> None:
        """A partition that outlasted the server's keepalives, then healed:
        the server ended every session open through us, and the news never
        reached the clients (their peer's FIN was lost). A client's open
        connection stays silent for ever — a statement it sends waits for an
        answer that cannot come; new connections work."""
        self._call(self._orphan())

    def stop(self) -> None:
        """Close every socket the proxy accepted or opened, then its loop:
        nothing is left to the garbage collector, whose ResourceWarning
        ('loop is closed') would fail whichever test it ran in."""
        try:
            self._call(self._close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._loop.close()

    def __enter__(self) -> "TcpProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _call(self, coroutine) -> None:
        asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=10)

    async def _listen(self) -> None:
        if self._server is None:
            cuts = self._cuts
            self._server = await asyncio.start_server(
                lambda reader, writer: self._accepted(reader, writer, cuts), "127.0.0.1", self.port, reuse_address=True
            )

    def _accepted(self, client_reader, client_writer, cuts: int) -> None:
        """A connection's transport is made (asyncio's connection_made): it is
        ours from here, before any task of it runs — one cancelled before its
        first step never reaches its own `finally`."""
        self._made.add(client_writer)
        self._connections += 1
        if cuts != self._cuts or self._stopping:  # accepted by a listener since closed
            client_writer.transport.abort()
            return
        self._writers.add(client_writer)
        task = self._loop.create_task(self._serve(client_reader, client_writer, cuts))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _cut(self) -> None:
        self._cuts += 1
        server, self._server = self._server, None
        if server is not None:
            # Accept no more, then let asyncio make the transports of those
            # it accepted (their tasks' first steps, queued already) before
            # close(): a transport made after it fails Server._attach's
            # assert, and its accepted socket is left open for the GC
            # (CPython gh-109564, gh-155934; in 3.11 here).
            for listener in server.sockets:
                self._loop.remove_reader(listener.fileno())
            await asyncio.sleep(0)
            server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        if server is not None:
            await server.wait_closed()

    async def _orphan(self) -> None:
        for client_writer, upstream_writer in list(self._pairs):
            self._orphaned.add(client_writer)
            upstream_writer.transport.abort()

    async def _close(self) -> None:
        self._stopping = True
        self._flowing.set()
        await self._cut()
        # asyncio's own tasks (_accept_connection2: a transport being made
        # for a connection accepted before the cut) are let finish, and
        # _accepted aborts each: cancelled before its first step, one would
        # drop its accepted socket unclosed. Ours are cancelled: each aborts
        # its sockets on the way out, and one cancelled before its first
        # step is aborted below (_accepted registered its client).
        for task in self._tasks:
            task.cancel()
        while others := {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}:
            _, pending = await asyncio.wait(others, timeout=1)
            for task in pending:  # stuck a second after its first step: cancelled, it closes what it holds
                task.cancel()
        for writer in list(self._made):
            writer.transport.abort()
        # An abort closes its socket on the loop's next turn
        # (connection_lost): the loop must not stop before.
        closing = [writer.wait_closed() for writer in list(self._made)]
        await asyncio.wait_for(asyncio.gather(*closing, return_exceptions=True), 5)

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection(*self.target)

    async def _serve(self, client_reader, client_writer, cuts: int) -> None:
        if cuts != self._cuts:  # cut before its task began
            client_writer.transport.abort()
            self._writers.discard(client_writer)
            return
        try:
            upstream_reader, upstream_writer = await self._open_upstream()
        except OSError:  # refused: the client must not wait for the GC
            client_writer.transport.abort()
            self._writers.discard(client_writer)
            return
        except asyncio.CancelledError:  # stop()
            client_writer.transport.abort()
            self._writers.discard(client_writer)
            raise
        self._made.add(upstream_writer)
        if cuts != self._cuts:  # cut while it was being made: it goes with the others
            client_writer.transport.abort()
            upstream_writer.transport.abort()
            self._writers.discard(client_writer)
            return
        self._writers.add(upstream_writer)
        self._pairs.add((client_writer, upstream_writer))
        await asyncio.gather(
            self._pipe(client_reader, upstream_writer, self.latency), self._pipe(upstream_reader, client_writer)
        )

    async def _pipe(self, reader, writer, latency: float = 0.0) -> None:
        try:
            while data := await reader.read(65536):
                if not self._flowing.is_set():
                    self._held += 1
                    try:
                        await self._flowing.wait()
                    finally:
                        self._held -= 1
                if latency:  # in flight together, in order: a round trip costs `latency`, not a queue
                    self._loop.call_later(latency, _write_unless_closed, writer, data)
                    continue
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            if writer not in self._orphaned:  # an orphaned client is never told
                writer.transport.abort()
                self._writers.discard(writer)
            self._pairs = {pair for pair in self._pairs if writer not in pair}


def _write_unless_closed(writer: asyncio.StreamWriter, data: bytes) -> None:
    if not writer.transport.is_closing():
        writer.write(data)
