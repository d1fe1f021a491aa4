"""How many processes `webhook-ingest run` (and `ingress --processes auto`)
start by default, chosen by `make bench` (docs/performance.md, "How the
default configuration was chosen").

Every process is one Python event loop using at most one core, so the
ingress gets one process per available core, sharing the port
(SO_REUSEPORT); the workers' cost per event falls as their batches grow, so
two processes with many messages in flight each beat more processes with
fewer (256 in flight: end to end 1,500-1,890 events/s against 1,420-1,540
with 64, 1,250-1,280 with 32; three workers 1,170-1,260). All of them
run their handlers at once when the handlers do not query `ctx.db`; as
many as the worker's transaction connections allow that do (each holds one
until its commit: 4 of the default budget of 8,
`WEBHOOK_INGEST_WORKER_CONNECTIONS`). Caps keep a large machine's defaults
within a default Postgres `max_connections` (docs/operations.md, "Postgres
connections").
"""

import math
import os

WORKERS = 2
CONCURRENCY = 256
MAX_AUTO_INGRESS_PROCESSES = 4
# Told to stop, the ingress gives requests in flight this long (aiohttp's
# shutdown timeout), a worker its running handlers (`--grace-seconds`).
INGRESS_GRACE = 60.0
WORKER_GRACE = 30.0


def available_cores() -> int:
    """Cores this process may use: its CPU set, and a container's CPU limit
    (cgroup v2 `cpu.max`), not the host's core count."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return min(cores, _cgroup_cpu_limit() or cores)


def _cgroup_cpu_limit(path: str = "/sys/fs/cgroup/cpu.max") -> int | None:
    """`quota period` -> whole cores (at least 1); None when unlimited or unknown."""
    try:
        with open(path) as cpu_max:
            quota, period = cpu_max.read().split()
        return max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):  # no file, "max", or not cgroup v2
        return None


def ingress_processes(requested: str) -> int:
    """`auto`: one per available core (at most 4); else the number given."""
    if requested == "auto":
        return max(1, min(available_cores(), MAX_AUTO_INGRESS_PROCESSES))
    return int(requested)


def ingress_commands(host: str, port: int, processes: int) -> dict[str, list[str]]:
    """Child name -> argv after `webhook-ingest`: several share the port."""
    argv = ["ingress", "--host", host, "--port", str(port), *(["--reuse-port"] if processes > 1 else [])]
    return {f"ingress-{n}": argv for n in range(1, processes + 1)}


def worker_commands(workers: int, concurrency: int, metrics_port: int | None) -> dict[str, list[str]]:
    """Child name -> argv; with `metrics_port`, worker n serves on metrics_port + n - 1."""
    commands = {}
    for n in range(1, workers + 1):
        metrics = ["--metrics-port", str(metrics_port + n - 1)] if metrics_port is not None else []
        commands[f"worker-{n}"] = ["worker", "--concurrency", str(concurrency), *metrics]
    return commands
