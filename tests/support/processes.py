"""Real worker and ingress processes for acceptance tests, and ways to wait on them."""

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import asyncpg
from prometheus_client.parser import text_string_to_metric_families

from tests.support import polling_connections
from tests.support.tcpproxy import free_port

ROOT = Path(__file__).resolve().parents[2]


# `webhook-ingest ARGS` after a prelude: `python -c` puts ARGS in sys.argv[1:].
MAIN_AFTER_PRELUDE = "\nfrom webhook_ingest.cli.main import main\nmain(prog_name='webhook-ingest')\n"


class Process:
    """A `webhook-ingest …` child whose output goes to a log file. A
    `prelude` (Python code) runs in it first: a test's way to shorten a
    limit or to slow a step down in the real command."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path, prelude: str | None = None):
        self.args = args
        self.log_path = log_path
        self._log = open(log_path, "ab")
        command = ["-m", "webhook_ingest"] if prelude is None else ["-c", prelude + MAIN_AFTER_PRELUDE]
        self.popen = subprocess.Popen(
            [sys.executable, *command, *args],
            env={**os.environ, **env},
            cwd=ROOT,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def kill(self) -> None:
        """SIGKILL: no cleanup, no acks — what a crash or the OOM killer does."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(timeout=10)

    def terminate(self, timeout: float = 60) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
        try:
            return self.popen.wait(timeout=timeout)
        finally:
            self._log.close()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


class Fleet:
    """Starts processes and guarantees none outlives the test."""

    def __init__(self, env: dict[str, str], log_dir: Path):
        self.env = env
        self.log_dir = log_dir
        self.processes: list[Process] = []

    def worker(self, *args: str, env: dict[str, str] | None = None) -> Process:
        return self._start(["worker", *args], env)

    def supervisor(self, *args: str, env: dict[str, str] | None = None, prelude: str | None = None) -> Process:
        """`webhook-ingest run`: the ingress and workers as its own children."""
        return self._start(["run", *args], env, prelude)

    def ingress(
        self,
        port: int | None = None,
        env: dict[str, str] | None = None,
        reuse_port: bool = False,
        prelude: str | None = None,
    ) -> tuple[Process, str]:
        port = port or free_port()
        process = self._start(["ingress", "--port", str(port), *(["--reuse-port"] if reuse_port else [])], env, prelude)
        return process, f"http://127.0.0.1:{port}"

    def _start(self, args: list[str], env: dict[str, str] | None, prelude: str | None = None) -> Process:
        name = f"{len(self.processes)}-{args[0]}.log"
        process = Process(args, {**self.env, **(env or {})}, self.log_dir / name, prelude)
        self.processes.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.processes:
            process.kill()
            with contextlib.suppress(Exception):
                process._log.close()


async def wait_until(predicate, timeout: float, interval: float = 0.05, message: str = "condition"):
    """Polls an async predicate until it returns a truthy value (every 50 ms: a
    test waits on it a few hundred times, each wait overshooting by half an interval)."""
    deadline = time.monotonic() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message} (last: {value!r})")
        await asyncio.sleep(interval)


async def count_rows(database_url: str, table: str, where: str = "TRUE") -> int:
    query = f"SELECT count(*) FROM {table} WHERE {where}"
    with contextlib.suppress(polling_connections.NotPolled):
        return await polling_connections.fetchval(database_url, query)
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetchval(query)
    finally:
        await connection.close()


async def wait_for_output(process: Process, text: str, timeout: float = 30) -> None:
    async def written() -> bool:
        return text in process.output()

    await wait_until(written, timeout, interval=0.05, message=f"{text!r} in {process.log_path.name}")


async def outcomes(metrics_urls: list[str]) -> dict[str, float]:
    """`webhook_events_total` summed by outcome over the workers' /metrics."""
    totals: dict[str, float] = {}
    async with aiohttp.ClientSession() as session:
        for url in metrics_urls:
            async with session.get(f"{url}/metrics") as response:
                text = await response.text()
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    if sample.name == "webhook_events_total":
                        outcome = sample.labels["outcome"]
                        totals[outcome] = totals.get(outcome, 0) + sample.value
    return totals
