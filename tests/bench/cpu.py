"""CPU time of every process an event passes through, read from /proc.

The shared services (RabbitMQ's `beam.smp`, `redis-server`, every `postgres`
process) also serve whoever else uses this machine, so their CPU over a
phase is corrected by their rate over a quiet moment just before it."""

import os
import time
from pathlib import Path

SERVICE_NAMES = ("beam.smp", "redis-server", "postgres")
_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICK


class BrokerCpu:
    """CPU the RabbitMQ node(s) on this machine used between `__init__` and
    `seconds()` (not `rabbitmqctl` runs). Only processes there at both
    reads count: a node still shutting down (the previous run's private
    one) would otherwise take its whole CPU time away."""

    def __init__(self):
        self._before = {pid: cpu_seconds(pid) for pid in service_pids("", 0)["beam.smp"]}

    def seconds(self) -> float:
        after = {pid: cpu_seconds(pid) for pid in service_pids("", 0)["beam.smp"]}
        return sum(after[pid] - used for pid, used in self._before.items() if pid in after)


def service_pids(database: str, redis_port: int) -> dict[str, list[int]]:
    """The broker's, Redis's and Postgres's processes that serve this
    deployment: the broker itself (not a `rabbitmqctl` run), the Redis on
    its port, Postgres's shared processes and the backends of its database
    (not other databases' on the same server)."""
    found: dict[str, list[int]] = {name: [] for name in SERVICE_NAMES}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name = (entry / "comm").read_text().strip()
            if name not in found:
                continue
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if _serves_us(name, argv, database, redis_port):
            found[name].append(int(entry.name))
    return found


def _serves_us(name: str, argv: str, database: str, redis_port: int) -> bool:
    if name == "beam.smp":
        return "rabbitmqctl" not in argv
    if name == "redis-server":
        return f":{redis_port}" in argv
    words = argv.split()
    is_backend = any((word.endswith(")") and "(" in word) or word == "[local]" for word in words)
    return not is_backend or database in words


class CpuMeter:
    """CPU of our processes plus the services', by name. A service process
    that appears during the measure (a new Postgres backend) counts whole."""

    def __init__(self, ours: dict[str, list[int]], database: str, redis_port: int):
        self._ours = ours
        self._database, self._redis_port = database, redis_port
        self._started = 0.0
        self._before: dict[str, float] = {}
        self._background: dict[str, float] = {}

    def _pids(self) -> dict[str, list[int]]:
        return {**self._ours, **service_pids(self._database, self._redis_port)}

    def _cpu_by_pid(self) -> dict[str, dict[int, float]]:
        return {name: {pid: cpu_seconds(pid) for pid in pids} for name, pids in self._pids().items()}

    async def measure_background(self, seconds: float = 2.0) -> None:
        """The services' CPU per second while our processes are idle."""
        import asyncio

        self.start()
        await asyncio.sleep(seconds)
        elapsed = time.perf_counter() - self._started
        self._background = {}
        self._background = {name: used / elapsed for name, used in self.stop().items() if name in SERVICE_NAMES}

    def start(self) -> None:
        self._before, self._started = self._cpu_by_pid(), time.perf_counter()

    def stop(self) -> dict[str, float]:
        """CPU seconds by name since `start`, the services' background taken off."""
        after, elapsed = self._cpu_by_pid(), time.perf_counter() - self._started
        used = {}
        for name, pids in after.items():
            before = self._before.get(name, {})
            used[name] = sum(cpu - before.get(pid, 0.0) for pid, cpu in pids.items())
            used[name] = max(0.0, used[name] - self._background.get(name, 0.0) * elapsed)
        return used
