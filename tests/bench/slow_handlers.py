"""Handlers that wait on the network, at the `run` defaults (issue 20).

One deployment (the processes `webhook-ingest run` starts), four sources,
each a phase; a downstream in this process answers each source's calls
after that phase's latency and counts them per key, so a handler run is
counted whether or not its transaction committed:

- `forward`: the built-in handler, to a downstream answering in 300 ms;
- `ctx_db`: writes through `ctx.db`, then calls the downstream (300 ms)
  with its transaction open — its connections are its limit;
- `fast`: calls a downstream answering in 5 ms, then writes;
- `mix`: the same with 90 % of the calls taking 5 ms and 10 % 2 s.

Each phase's events are sent through the ingress as fast as it takes them
(a backlog forms) and timed from the first send to the last effect. It
reports events/s, the bound (processes × in flight / mean latency; for
`ctx_db`, processes × transaction connections / latency), handler runs per
event, the most Postgres connections open at once, lost and duplicated.
"""

import asyncio
import collections
import hashlib
import os
import re
import time
from collections.abc import Callable

import asyncpg

from tests.bench import httpload
from tests.bench.cpu import CpuMeter
from tests.bench.deployment import CONCURRENCY, SECRET, WORKERS, Deployment, source_entry
from tests.support.processes import wait_until
from tests.support.tcpproxy import free_port
from webhook_ingest.shared.settings import WORKER_CONNECTIONS
from webhook_ingest.workers.connection_budget import split

SLOW_SHARE, SLOW_SECONDS, FAST_SECONDS, CALL_SECONDS = 0.1, 2.0, 0.005, 0.3
TRANSACTION_CONNECTIONS = split(WORKER_CONNECTIONS, CONCURRENCY).transactions  # the handler-transaction pool
SETTLE_SECONDS = 1.5  # a deferral would be back from the 1 s queue by then


class Phase:
    def __init__(
        self, source: str, handler: str, events: int, mean_latency: float, in_flight: int, commits: bool = True
    ):
        self.source, self.handler, self.events = source, handler, events
        self.bound = WORKERS * in_flight / mean_latency
        self.commits = commits  # whether the handler writes a row to bench_effects


PHASES = [
    Phase("forward", "forward", 6_000, CALL_SECONDS, CONCURRENCY, commits=False),
    Phase("ctx_db", "tests.bench.handler:record_while_calling", 1_200, CALL_SECONDS, TRANSACTION_CONNECTIONS),
    Phase("fast", "tests.bench.handler:call_then_record", 12_000, FAST_SECONDS, CONCURRENCY),
    Phase(
        "mix",
        "tests.bench.handler:call_then_record",
        12_000,
        (1 - SLOW_SHARE) * FAST_SECONDS + SLOW_SHARE * SLOW_SECONDS,
        CONCURRENCY,
    ),
]
CHOSEN = [phase for phase in PHASES if phase.source in os.environ.get("BENCH_SLOW_PHASES", "forward,ctx_db,fast,mix")]
ROWS = [
    row
    for phase in PHASES
    for row in (
        (f"slow_{phase.source}_events_per_s", f"{phase.source}: events/s ({phase.events:,})", "{:,.0f}"),
        (f"slow_{phase.source}_vs_bound", f"{phase.source}: events/s / bound", "{:.2f}"),
        (f"slow_{phase.source}_runs_per_event", f"{phase.source}: handler runs per event", "{:.3f}"),
        (f"slow_{phase.source}_peak_pg_connections", f"{phase.source}: peak Postgres connections", "{:.0f}"),
        (f"slow_{phase.source}_cpu_ms_per_event", f"{phase.source}: CPU ms per event, every process", "{:.2f}"),
        (f"slow_{phase.source}_cpu_ms_workers", f"{phase.source}: workers' CPU ms per event", "{:.2f}"),
    )
] + [("slow_mix_vs_fast", "mix (90 % 5 ms, 10 % 2 s) / 5 ms alone", "{:.2f}")]


def latency(source: str, key: str) -> float:
    if source == "fast":
        return FAST_SECONDS
    if source == "mix":
        slow = hashlib.sha256(key.encode()).digest()[0] < 256 * SLOW_SHARE
        return SLOW_SECONDS if slow else FAST_SECONDS
    return CALL_SECONDS


class Downstream(asyncio.Protocol):
    """Answers 200 after the phase's latency (`latency(source, key)`); counts calls per (source, key).

    HTTP/1.1 on raw sockets, parsed only as far as the path, the
    Idempotency-Key and the Content-Length, like the load client
    (`httpload.py`): it shares the two cores with what it measures, and an
    aiohttp server cost more there than the worker's own HTTP client."""

    def __init__(self, latency: Callable[[str, str], float] = latency) -> None:
        self.latency = latency
        self.calls: collections.Counter[tuple[str, str]] = collections.Counter()
        self.port = free_port()
        self._server: asyncio.Server | None = None

    def __call__(self) -> "_Connection":  # the protocol factory
        return _Connection(self)

    async def __aenter__(self) -> "Downstream":
        self._server = await asyncio.get_running_loop().create_server(self, "127.0.0.1", self.port, backlog=1024)
        return self

    async def __aexit__(self, *exc) -> None:
        assert self._server is not None
        self._server.close()

    def runs(self, source: str) -> tuple[int, int]:
        """(handler runs, distinct keys) of a phase."""
        counts = [count for (called, _), count in self.calls.items() if called == source]
        return sum(counts), len(counts)


class _Connection(asyncio.Protocol):
    ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"

    def __init__(self, downstream: Downstream):
        self._downstream = downstream
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport) -> None:
        self._transport = transport

    def connection_lost(self, exc) -> None:
        self._transport = None

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while (end := self._buffer.find(b"\r\n\r\n")) >= 0:
            head = bytes(self._buffer[:end])
            length = _CONTENT_LENGTH.search(head)
            total = end + 4 + (int(length.group(1)) if length else 0)
            if len(self._buffer) < total:
                return
            del self._buffer[:total]
            source = head[head.index(b"/") + 1 : head.index(b" HTTP/")].decode()
            key = _IDEMPOTENCY_KEY.search(head).group(1).decode()  # type: ignore[union-attr]
            self._downstream.calls[source, key] += 1
            asyncio.get_running_loop().call_later(self._downstream.latency(source, key), self._answer)

    def _answer(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(self.ANSWER)


_CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")
_IDEMPOTENCY_KEY = re.compile(rb"(?i)\r\nidempotency-key: *([^\r]+)")


async def measure(figures: dict) -> None:
    async with Downstream() as downstream:
        sources = "".join(
            source_entry(phase.source, phase.handler, url=f"http://127.0.0.1:{downstream.port}/{phase.source}")
            for phase in PHASES
        )
        async with Deployment(sources=sources) as deployment:
            await deployment.start_ingress()
            await deployment.start_workers()
            meter = CpuMeter(
                {**deployment.pids(), "bench": [os.getpid()]}, deployment.database_name, deployment.redis_port
            )
            await meter.measure_background()
            for phase in CHOSEN:
                await run_phase(deployment, downstream, meter, phase, figures)
    if "slow_mix_events_per_s" in figures and "slow_fast_events_per_s" in figures:
        figures["slow_mix_vs_fast"] = figures["slow_mix_events_per_s"] / figures["slow_fast_events_per_s"]


async def run_phase(
    deployment: Deployment, downstream: Downstream, meter: CpuMeter, phase: Phase, figures: dict
) -> None:
    requests = httpload.signed_requests(phase.source, SECRET, f"{phase.source}_", phase.events)
    meter.start()
    async with PeakConnections(deployment.database_url) as peak:
        started = time.perf_counter()
        _, _, statuses = await httpload.closed_loop(deployment.ingress_port, requests)
        if set(statuses) != {200}:
            raise SystemExit(f"FAIL: slow handlers, {phase.source}: the ingress answered {statuses}")
        await until_completed(deployment, phase)
        elapsed = time.perf_counter() - started
        cpu = meter.stop()
    await asyncio.sleep(SETTLE_SECONDS)
    runs, keys = downstream.runs(phase.source)
    completed, effect_rows = await outcome(deployment, phase)
    name = f"slow_{phase.source}"
    figures[f"{name}_events_per_s"] = phase.events / elapsed
    figures[f"{name}_bound"] = phase.bound
    figures[f"{name}_vs_bound"] = figures[f"{name}_events_per_s"] / phase.bound
    figures[f"{name}_runs_per_event"] = runs / phase.events
    figures[f"{name}_peak_pg_connections"] = peak.most
    figures[f"{name}_cpu_ms_per_event"] = 1000 * sum(cpu.values()) / phase.events
    for process, seconds in cpu.items():  # the bench's own: the load client and the downstream
        figures[f"{name}_cpu_ms_{process.split('.')[0].replace('-', '_')}"] = 1000 * seconds / phase.events
    figures["lost"] = figures.get("lost", 0) + phase.events - min(completed, keys)
    duplicated = runs - keys if not phase.commits else effect_rows - completed
    figures["duplicated_effects"] = figures.get("duplicated_effects", 0) + duplicated


async def until_completed(deployment: Deployment, phase: Phase) -> None:
    async def done() -> bool:
        return (await outcome(deployment, phase))[0] >= phase.events

    await wait_until(done, 300, interval=0.05, message=f"{phase.events} {phase.source} events completed")


async def outcome(deployment: Deployment, phase: Phase) -> tuple[int, int]:
    """(events completed, effect rows) of a phase: processed_events for a
    handler that writes nothing of its own, bench_effects for the others."""
    if not phase.commits:
        completed = await deployment.fetchval(
            "SELECT count(*) FROM processed_events WHERE key LIKE $1", f"{phase.source}:%"
        )
        return completed, completed
    completed = await deployment.fetchval(
        "SELECT count(DISTINCT key) FROM bench_effects WHERE key LIKE $1", f"{phase.source}:%"
    )
    rows = await deployment.fetchval("SELECT count(*) FROM bench_effects WHERE key LIKE $1", f"{phase.source}:%")
    return completed, rows


class PeakConnections:
    """The most connections to the deployment's database at once, sampled
    every 50 ms (its own sampling connection not counted)."""

    def __init__(self, database_url: str):
        self._url = database_url
        self.most = 0
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> "PeakConnections":
        connection = await asyncpg.connect(self._url)
        self._task = asyncio.create_task(self._sample(connection))
        return self

    async def _sample(self, connection: asyncpg.Connection) -> None:
        try:
            while True:
                count = await connection.fetchval(
                    "SELECT count(*) - 1 FROM pg_stat_activity WHERE datname = current_database()"
                )
                self.most = max(self.most, count)
                await asyncio.sleep(0.05)
        finally:
            await connection.close()

    async def __aexit__(self, *exc) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
