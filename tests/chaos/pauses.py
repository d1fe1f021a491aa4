"""Faults that stop time rather than break a connection: a worker stopped
with SIGSTOP and continued (a GC pause, a throttled container, a VM
migration), for 0.5 s to 1.2 x the lock TTL; and a CPU hog, a process
spinning on one core for a few seconds beside everything else (the
machine under load: every loop lags).

A pause under the TTL must repeat no external call; one past it may, for a
key another worker really took meanwhile (docs/design.md, "Exclusion";
tests/chaos/reruns.py judges which).
"""

import asyncio
import contextlib
import os
import random
import signal
import sys

from tests.chaos.plan import Fault

PAUSES_EVERY = 8.0  # seconds between pauses, on average
HOGS = (1, 2)  # how many hogs a run has, at least and at most
HOG_SECONDS = (3.0, 8.0)
HOG = "import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end:\n    pass\n"


def draw(rng: random.Random, duration: float, workers: int, lock_ttl: float) -> list[Fault]:
    schedule, at = [], rng.uniform(1.0, PAUSES_EVERY)
    while at < duration:
        schedule.append(Fault(at, "pause", rng.randrange(workers), seconds=rng.uniform(0.5, 1.2 * lock_ttl)))
        at += rng.expovariate(1 / PAUSES_EVERY)
    for _ in range(rng.randint(*HOGS)):
        schedule.append(Fault(rng.uniform(0.1, 0.8) * duration, "hog", seconds=rng.uniform(*HOG_SECONDS)))
    return schedule


async def paused(pid: int, seconds: float) -> None:
    """SIGSTOP, then SIGCONT `seconds` later; a process killed meanwhile
    (an overlapping kill) is left alone."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return
    try:
        await asyncio.sleep(seconds)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


async def cpu_hog(seconds: float) -> None:
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", HOG.format(seconds=seconds))
    try:
        await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
