"""Every call that leaves a simulated process is an await point here: a
seeded latency (a long tail included), and the place where a killed
process stops.

A process is killed by cancelling its tasks; what its code then does on
the way out (a `finally` releasing a lease, an ack) must not reach the
world, as nothing of a SIGKILLed process does. So every call of a dead
process raises `Killed`, a BaseException no `except Exception` of the
product swallows. A kill can also be armed to strike at a process's Nth
await point here (before a request goes, or after its reply came), so
that every point is as likely as any other, however short the time
between them (`crash` in the plan).
"""

import asyncio
import random
from collections.abc import Callable

from tests.sim.loop import PROCESS

# seconds one way: (usual low, usual high); 1 % of calls take 10-50 times longer
LATENCY = {"amqp": (0.0001, 0.001), "redis": (0.00005, 0.0005), "pg": (0.0001, 0.001), "world": (0.0, 0.0)}


class Killed(BaseException):
    """The process this call belongs to was killed."""


class Network:
    def __init__(self, rng: random.Random):
        self._rng = rng
        self.dead: set[str] = set()
        self._armed: dict[str, tuple[int, Callable[[], None]]] = {}  # process -> (points left, the kill)

    def arm(self, process: str, points: int, kill: Callable[[], None]) -> None:
        self._armed[process] = (points, kill)

    def disarm(self) -> None:
        self._armed.clear()

    def latency(self, service: str) -> float:
        low, high = LATENCY[service]
        rng = self._rng
        seconds = rng.uniform(low, high)
        return seconds * rng.uniform(10, 50) if rng.random() < 0.01 else seconds

    def check_alive(self) -> None:
        process = PROCESS.get()
        if process in self._armed:
            points, kill = self._armed[process]
            if points <= 1:
                del self._armed[process]
                kill()
            else:
                self._armed[process] = (points - 1, kill)
        if process in self.dead:
            raise Killed()

    async def hop(self, service: str) -> None:
        self.check_alive()
        await asyncio.sleep(self.latency(service))
        self.check_alive()
