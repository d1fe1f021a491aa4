"""`make bench --peers`: the Celery stack of `celery_stack.py` and the
Dramatiq stack of `dramatiq_stack.py`, one after the other, under the
bench's load client, beside our own figures of the same run: events/s end
to end (20,000 unique events, first send to last row), p99 at 1,000 req/s
offered, CPU per event over every process (receiver, worker, broker,
Postgres), and lost / duplicated rows after `kill -9` of a worker process
under 400 events/s (Dramatiq stops every worker when one dies: it is
started again, as its supervisor would); then, ours first, lost and
duplicated rows and repeated calls after a 2.5 s SIGSTOP of one, with a
handler that calls a downstream (100 ms) then writes (tests/bench/faults.py;
`--phase pause` that step alone). The peers' venv (build/peers-venv) is
made on first use; their processes are started and stopped here."""

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncpg

from tests.bench import faults, httpload
from tests.bench.cpu import CpuMeter
from tests.bench.deployment import AMQP_URL, SECRET, SERVER_URL, fetchval
from tests.bench.peers.downstream import CALLING_SOURCE
from tests.bench.slow_handlers import Downstream
from tests.support.processes import ROOT, wait_until
from tests.support.tcpproxy import free_port

VENV = ROOT / "build" / "peers-venv"
PACKAGES = [
    "celery==5.5.3",
    "dramatiq[rabbitmq]==2.2.1",
    "uvicorn[standard]==0.32.1",
    "starlette==0.41.3",
    "psycopg[binary]==3.2.3",
]
KINDS = ("celery", "dramatiq")
NAMES = {"celery": "Celery", "dramatiq": "Dramatiq"}
SOURCE, EVENTS, LATENCY_RATE, LATENCY_SECONDS = "peer", 20_000, 1_000, 5
PROCESSES = os.cpu_count() or 2


def ensure_venv() -> Path:
    if not all((VENV / "bin" / kind).exists() for kind in KINDS):
        if not (VENV / "bin" / "pip").exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(VENV / "bin" / "pip"), "install", "--quiet", *PACKAGES], check=True)
    return VENV / "bin"


class PeerStack:
    """One peer (`kind`, its module `tests.bench.peers.KIND_stack`): its database, queue and processes."""

    def __init__(self, kind: str, downstream_port: int) -> None:
        run_id = uuid.uuid4().hex[:8]
        self.kind, self.name = kind, NAMES[kind]
        self.database = f"wi_peer_{kind}_{run_id}"
        self.database_url = SERVER_URL.rsplit("/", 1)[0] + f"/{self.database}"
        self.queue = f"peer_{kind}_{run_id}"
        self.port = free_port()
        self.downstream_url = f"http://127.0.0.1:{downstream_port}/{kind}"  # the calling handler's
        self.processes: dict[str, subprocess.Popen] = {}
        self.restarts = 0

    def _env(self) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "PEER_AMQP_URL": AMQP_URL,
            "PEER_SECRET": SECRET,
            "PEER_DATABASE_URL": self.database_url,
            "PEER_QUEUE": self.queue,
            "PEER_DOWNSTREAM_URL": self.downstream_url,
        }

    async def __aenter__(self) -> "PeerStack":
        bin_dir = await asyncio.to_thread(ensure_venv)
        server = await asyncpg.connect(SERVER_URL)
        try:
            await server.execute(f'CREATE DATABASE "{self.database}"')
        finally:
            await server.close()
        await self.fetchval("CREATE TABLE peer_effects (key text NOT NULL, payload text NOT NULL)")
        self._start(bin_dir)
        await wait_until(self._answering, 60, message=f"the {self.name} stack's receiver")
        return self

    def _start(self, bin_dir: Path) -> None:
        self.bin_dir = bin_dir
        self.processes["receiver"] = subprocess.Popen(
            [
                str(bin_dir / "uvicorn"),
                f"tests.bench.peers.{self.kind}_stack:receiver",
                "--port",
                str(self.port),
                "--workers",
                str(PROCESSES),
                "--no-access-log",
                "--log-level",
                "warning",
            ],
            **self._quiet(),
        )
        self.start_worker()

    def _quiet(self) -> dict:
        return {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "env": self._env(), "cwd": ROOT}

    def start_worker(self) -> None:
        self.processes["worker"] = subprocess.Popen(self._worker_command(), **self._quiet())

    def _worker_command(self) -> list[str]:
        if self.kind == "dramatiq":
            return [
                str(self.bin_dir / "dramatiq"),
                "tests.bench.peers.dramatiq_stack",
                "--processes",
                str(PROCESSES),
                "--threads",
                "8",  # its default
                "--queues",
                self.queue,
            ]
        return [
            str(self.bin_dir / "celery"),
            "-A",
            "tests.bench.peers.celery_stack",
            "worker",
            "-P",
            "prefork",
            "--concurrency",
            str(PROCESSES),
            "-Q",
            self.queue,
            "--without-gossip",
            "--without-mingle",
            "--loglevel",
            "warning",
        ]

    def _stop(self) -> None:
        for process in self.processes.values():
            process.terminate()
        for process in self.processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()

    async def _answering(self) -> bool:
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", self.port)
        except OSError:
            return False
        writer.close()
        receiver = _tree(self.processes["receiver"].pid)
        return len(receiver) > PROCESSES and len(self.worker_children()) >= PROCESSES  # their processes are up

    def pids(self) -> list[int]:
        return [pid for process in self.processes.values() for pid in _tree(process.pid)]

    def worker_children(self) -> list[int]:
        return _tree(self.processes["worker"].pid)[1:]

    async def fetchval(self, sql: str, *args):
        return await fetchval(self.database_url, sql, *args)

    async def __aexit__(self, *exc) -> None:
        await asyncio.to_thread(self._stop)
        server = await asyncpg.connect(SERVER_URL)
        try:
            await server.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        finally:
            await server.close()
        for queue in [self.queue, *([f"{self.queue}.DQ", f"{self.queue}.XQ"] if self.kind == "dramatiq" else [])]:
            await _delete_queue(queue)


async def measure(figures: dict, pause_only: bool = False) -> None:
    """Each peer's steps; with `pause_only`, ours and each peer under the pause alone."""
    async with Downstream(faults.call_latency) as downstream:
        await faults.ours_paused(downstream, figures)
        for kind in KINDS:
            async with PeerStack(kind, downstream.port) as stack:
                if not pause_only:
                    await _end_to_end(stack, figures)
                    await _latency(stack, figures)
                    await _kill(stack, figures)
                await _pause(stack, downstream, figures)


def ratios(figures: dict) -> None:
    """Ours against each peer's of the same run: events/s end to end, CPU per event."""
    for kind in KINDS:
        if f"{kind}_e2e_events_per_s" in figures:
            figures[f"e2e_vs_{kind}"] = figures["e2e_events_per_s"] / figures[f"{kind}_e2e_events_per_s"]
            figures[f"cpu_vs_{kind}"] = figures["total_cpu_ms_per_event"] / figures[f"{kind}_total_cpu_ms_per_event"]


async def _end_to_end(stack: PeerStack, figures: dict) -> None:
    requests = httpload.signed_requests(SOURCE, SECRET, "e2e_", EVENTS)
    meter = CpuMeter({"peer": stack.pids()}, stack.database, 0)
    await meter.measure_background()
    meter.start()
    started = time.perf_counter()
    _, _, statuses = await httpload.closed_loop(stack.port, requests)
    await _until_rows(stack, "e2e_", EVENTS)
    figures[f"{stack.kind}_e2e_events_per_s"] = EVENTS / (time.perf_counter() - started)
    figures[f"{stack.kind}_total_cpu_ms_per_event"] = 1000 * sum(meter.stop().values()) / EVENTS
    figures[f"{stack.kind}_non_200"] = sum(count for status, count in statuses.items() if status != 200)


async def _latency(stack: PeerStack, figures: dict) -> None:
    requests = httpload.signed_requests(SOURCE, SECRET, "rate_", LATENCY_RATE * LATENCY_SECONDS)
    latencies, _ = await httpload.open_loop(stack.port, requests, LATENCY_RATE)
    latencies.sort()
    figures[f"{stack.kind}_p99_ms"] = 1000 * latencies[int(len(latencies) * 0.99)]
    await _until_rows(stack, "rate_", len(requests))


async def _kill(stack: PeerStack, figures: dict) -> None:
    """kill -9 of one worker child half-way through 3 s at 400 events/s; a
    worker whose whole stack stops then (Dramatiq's) is started again."""
    supervising: list[asyncio.Task] = []

    async def kill() -> None:
        os.kill(stack.worker_children()[0], signal.SIGKILL)
        supervising.append(asyncio.create_task(_supervise(stack)))

    rows = faults.Rows(stack.fetchval, "peer_effects", SOURCE, "kill_")
    try:
        outcome = await faults.under_fault(stack.port, rows, SOURCE, "kill_", kill)
    finally:
        for task in supervising:
            task.cancel()
    figures.update(outcome.figures(stack.kind, "kill"))
    figures[f"{stack.kind}_restarts_after_kill"] = stack.restarts


async def _pause(stack: PeerStack, downstream: Downstream, figures: dict) -> None:
    """SIGSTOP of the worker child `_kill` kills, 2.5 s, half-way through
    3 s at 400 events/s, with the handler that calls the downstream first."""
    rows = faults.Rows(stack.fetchval, "peer_effects", CALLING_SOURCE, "pause_")
    victim = stack.worker_children()[0]
    outcome = await faults.under_fault(
        stack.port, rows, CALLING_SOURCE, "pause_", lambda: faults.pause(victim), (downstream, stack.kind)
    )
    figures.update(outcome.figures(stack.kind, "pause"))


async def _supervise(stack: PeerStack) -> None:
    """As systemd's `Restart=always` would: the worker started again once it has exited."""
    while True:
        await asyncio.sleep(0.2)
        if stack.processes["worker"].poll() is not None:
            stack.start_worker()
            stack.restarts += 1


async def _until_rows(stack: PeerStack, prefix: str, count: int) -> None:
    rows = faults.Rows(stack.fetchval, "peer_effects", SOURCE, prefix)

    async def written() -> bool:
        return await rows.written() >= count

    await wait_until(written, 180, interval=0.1, message=f"{count} {prefix} rows of the {stack.name} stack")


def _tree(pid: int) -> list[int]:
    """`pid` and its descendants (/proc/PID/task/*/children)."""
    found = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in children:
            found += _tree(int(child))
    return found


async def _delete_queue(name: str) -> None:
    import aio_pika

    connection = await aio_pika.connect(AMQP_URL)
    async with connection:
        channel = await connection.channel()
        await channel.queue_delete(name)
