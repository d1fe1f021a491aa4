"""A lean HTTP/1.1 load client: pre-built request bytes on keep-alive
connections, responses parsed only as far as status and Content-Length.

Why not aiohttp's client: on two cores the load generator shares the CPU
with what it measures; this client costs a fraction of aiohttp's per
request, so more of the machine goes to the ingress.
"""

import asyncio
import contextlib
import gc
import re
import time

import orjson

from webhook_ingest.shared import signatures

_CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")
BODY_BYTES = 1024


def signed_requests(
    source: str, secret: str, prefix: str, count: int, copies: int = 1, objects: int = 0
) -> list[bytes]:
    """`count` unique 1 KiB events (ids `{prefix}{n}`), each `copies` times in a row;
    with `objects`, event n names object `obj_{n % objects}` (an ordering key's value)."""
    requests = []
    for n in range(count):
        event = {"id": f"{prefix}{n}", "type": "bench.event", "pad": ""}
        if objects:
            event["object"] = f"obj_{n % objects}"
        event["pad"] = "x" * (BODY_BYTES - len(orjson.dumps(event)))
        body = orjson.dumps(event)
        headers = signatures.sign("hmac-sha256", body, secret) | {
            "Content-Type": "application/json",
            "Content-Length": str(len(body)),
            "Host": "127.0.0.1",
        }
        head = f"POST /webhooks/{source} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        requests.extend([head.encode() + b"\r\n" + body] * copies)
    return requests


class Connection(asyncio.Protocol):
    duplicates = 0  # answers `{"status":"duplicate"}`, over every connection

    def __init__(self):
        self._buffer = bytearray()
        self._waiter: asyncio.Future | None = None
        self._transport = None

    def connection_made(self, transport) -> None:
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        length = _CONTENT_LENGTH.search(self._buffer, 0, end + 2)
        total = end + 4 + (int(length.group(1)) if length else 0)
        if len(self._buffer) >= total:
            status = int(self._buffer[9:12])
            if self._buffer.find(b'"duplicate"', end, total) >= 0:
                Connection.duplicates += 1
            del self._buffer[:total]
            self._waiter.set_result(status)

    def connection_lost(self, exc) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(ConnectionError("connection closed"))

    async def request(self, raw: bytes) -> int:
        self._waiter = asyncio.get_running_loop().create_future()
        self._transport.write(raw)
        return await self._waiter

    def close(self) -> None:
        self._transport.close()


async def connect(port: int, count: int) -> list[Connection]:
    loop = asyncio.get_running_loop()
    return [(await loop.create_connection(Connection, "127.0.0.1", port))[1] for _ in range(count)]


@contextlib.contextmanager
def gc_paused():
    """No cyclic GC while measuring: a 20-45 ms collection in the load
    client would be charged to the ingress's latency."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


async def closed_loop(
    port: int, requests: list[bytes], connections: int = 64, seconds: float | None = None
) -> tuple[int, float, dict[int, int]]:
    """Each connection sends its next request when the last one answered.
    Stops after `seconds` (or when `requests` run out); returns (sent, elapsed, statuses)."""
    pool = await connect(port, connections)
    statuses: dict[int, int] = {}
    position = 0
    started = time.perf_counter()
    deadline = started + seconds if seconds else float("inf")

    async def drive(connection: Connection) -> None:
        nonlocal position
        while position < len(requests) and time.perf_counter() < deadline:
            raw, position = requests[position], position + 1
            status = await connection.request(raw)
            statuses[status] = statuses.get(status, 0) + 1

    await asyncio.gather(*(drive(c) for c in pool))
    elapsed = time.perf_counter() - started
    for connection in pool:
        connection.close()
    return sum(statuses.values()), elapsed, statuses


async def open_loop(
    port: int, requests: list[bytes], rate: float, connections: int = 64, statuses: dict[int, int] | None = None
) -> tuple[list[float], dict[int, int]]:
    """Sends at fixed times (`rate` per second) whatever the answers do;
    each latency runs from the request's scheduled time, so a stall counts
    for every request it delayed. Returns latencies in seconds and statuses
    (counted into `statuses` as the answers come, when given)."""
    idle: asyncio.Queue[Connection] = asyncio.Queue()
    for connection in await connect(port, connections):
        idle.put_nowait(connection)
    latencies: list[float] = []
    statuses = {} if statuses is None else statuses

    async def send(raw: bytes, scheduled: float) -> None:
        connection = await idle.get()
        status = await connection.request(raw)
        latencies.append(time.perf_counter() - scheduled)
        statuses[status] = statuses.get(status, 0) + 1
        idle.put_nowait(connection)

    loop_start = time.perf_counter() + 0.05
    tasks = []
    for n, raw in enumerate(requests):
        scheduled = loop_start + n / rate
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(raw, scheduled)))
    await asyncio.gather(*tasks)
    while not idle.empty():
        idle.get_nowait().close()
    return latencies, statuses
