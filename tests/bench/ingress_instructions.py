"""`python -m tests.bench.ingress_instructions`: instructions per ingress
request under callgrind, the yardstick for a change of a few per cent to
the request path when other work shares the machine (CPU time per request
moves by tens of per cent with the load; instruction counts do not).

One ingress process under `valgrind --tool=callgrind --instr-atstart=no`;
instrumentation on once it is connected, WARM_UP requests, counters zeroed,
REQUESTS signed 1 KiB events at RATE per second on 8 connections, one dump:
its total over REQUESTS. Run it before and after a change, one right after
the other (and again in the opposite order): the same code twice differs by
up to ~1.5 %. Needs valgrind; a run takes about a minute."""

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.bench import httpload
from tests.bench.deployment import SECRET, SOURCE, Deployment
from tests.support.tcpproxy import free_port

ROOT = Path(__file__).resolve().parents[2]
WARM_UP, REQUESTS, RATE = 200, 300, 20.0


async def instructions_per_request(deployment: Deployment, requests: int, run: int) -> float:
    directory = Path(tempfile.mkdtemp(prefix="wi-callgrind-"))
    log = directory / "ingress.log"
    port, ingress = _start(deployment, directory, log)
    try:
        await _until_logged(log, "broker_connected")
        _control(ingress.pid, "-i", "on")
        await _send(port, f"cgwarm{run}_", WARM_UP)
        _control(ingress.pid, "-z")
        await _send(port, f"cg{run}_", requests)
        _control(ingress.pid, "-d")
        ingress.terminate()
        ingress.wait(60)
        return _total(directory, log) / requests
    finally:
        if ingress.poll() is None:
            ingress.kill()
        shutil.rmtree(directory, ignore_errors=True)


def _start(deployment: Deployment, directory: Path, log: Path) -> tuple[int, subprocess.Popen]:
    port = free_port()
    with open(log, "wb") as output:
        return port, subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={directory}/callgrind.out",
                sys.executable,
                "-m",
                "webhook_ingest",
                "ingress",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            env={**os.environ, **deployment.fleet.env},
            cwd=ROOT,
            stdout=output,
            stderr=subprocess.STDOUT,
        )


def _total(directory: Path, log: Path) -> int:
    """The instructions of the dump made after the measured requests."""
    if "stored_in_outbox" in log.read_text(errors="replace"):
        raise SystemExit("FAIL: requests went to the outbox (a slow broker under valgrind): measure again")
    dump = next(
        path for path in directory.glob("callgrind.out*") if "Trigger: dump" in path.read_text(errors="replace")
    )
    summary = next(line for line in dump.read_text().splitlines() if line.startswith("summary:"))
    return int(summary.split()[1])


async def _send(port: int, prefix: str, count: int) -> None:
    _, statuses = await httpload.open_loop(
        port, httpload.signed_requests(SOURCE, SECRET, prefix, count), RATE, connections=8
    )
    if set(statuses) != {200}:
        raise SystemExit(f"FAIL: the ingress answered {statuses}")


def _logged(log: Path, text: str) -> bool:
    return text in log.read_text(errors="replace")


def _control(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


async def _until_logged(log: Path, text: str, seconds: float = 600) -> None:
    deadline = time.monotonic() + seconds
    while not _logged(log, text):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the ingress under valgrind did not log {text} (see {log})")
        await asyncio.sleep(0.5)


async def main(requests: int, runs: int) -> None:
    async with Deployment() as deployment:
        for run in range(runs):
            count = await instructions_per_request(deployment, requests, run)
            print(f"run {run + 1}: {count / 1e6:.3f} M instructions per request", flush=True)
            await deployment.purge_events()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m tests.bench.ingress_instructions")
    parser.add_argument("--requests", type=int, default=REQUESTS)
    parser.add_argument("--runs", type=int, default=1)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.requests, arguments.runs))
