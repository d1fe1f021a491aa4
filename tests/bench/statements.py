"""Statements and round trips per event of the steady bench's handler
(issue 39): ours end to end as in `make bench` (warmed with 2,000 events,
then 20,000 unique ones), with Postgres's `pg_stat_statements` and Redis's
`INFO commandstats` reset after the warm-up and read after the last event
was handled; each statement's calls, rows and execution time per event,
then the CPU per event of each process.

Both services must be private ones: the statistics are the server's, and
resetting them on a shared server would wipe others'. Start a Postgres with
`shared_preload_libraries = 'pg_stat_statements'` (initdb, pg_ctl on a free
port) and a `redis-server --port N`, then

    BENCH_POSTGRES_URL=postgresql://postgres@127.0.0.1:PG/postgres \\
    BENCH_REDIS_URL=redis://127.0.0.1:N/0 python -m tests.bench.statements

(`CREATE EXTENSION pg_stat_statements` in its `postgres` database first)."""

import asyncio
import os
import signal
import time

import asyncpg
import redis.asyncio as redis

from tests.bench import httpload
from tests.bench.__main__ import E2E_EVENTS, until_effects, until_handled
from tests.bench.cpu import CpuMeter
from tests.bench.deployment import REDIS_URL, SECRET, SERVER_URL, SOURCE, Deployment

STATEMENTS = """
SELECT calls, rows, total_exec_time, max_exec_time, query FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = $1) ORDER BY calls DESC, total_exec_time DESC
"""


async def measure(events: int = E2E_EVENTS) -> None:
    server = await asyncpg.connect(SERVER_URL)
    cache = redis.from_url(REDIS_URL)
    try:
        async with Deployment() as deployment:
            await deployment.start_ingress()
            await deployment.start_workers()
            requests = httpload.signed_requests(SOURCE, SECRET, "warm_", 2_000)
            await httpload.closed_loop(deployment.ingress_port, requests)
            await until_effects(deployment, "warm_", 2_000)
            deployment.handled = 2_000
            await until_handled(deployment, deployment.handled)
            await asyncio.sleep(1)  # the archive's outcome rows of the warm-up
            meter = CpuMeter(deployment.pids(), deployment.database_name, deployment.redis_port)
            await meter.measure_background()
            await server.execute("SELECT pg_stat_statements_reset()")
            await cache.config_resetstat()
            profilers = await profile(deployment.pids()["workers"])
            meter.start()
            started = time.perf_counter()
            await httpload.closed_loop(
                deployment.ingress_port, httpload.signed_requests(SOURCE, SECRET, "e2e_", events)
            )
            await until_effects(deployment, "e2e_", events)
            elapsed = time.perf_counter() - started
            deployment.handled += events
            await until_handled(deployment, deployment.handled)
            await asyncio.sleep(1)
            shares = meter.stop()
            for profiler in profilers:
                profiler.send_signal(signal.SIGINT)
                await profiler.wait()
            rows = await server.fetch(STATEMENTS, deployment.database_name)
            commands = await cache.info("commandstats")
    finally:
        await server.close()
        await cache.aclose()
    print(f"{events:,} events, {events / elapsed:,.0f} events/s end to end")
    print(
        "| statement | calls / event | rows / event | exec ms / event | max ms |\n| --- | ---: | ---: | ---: | ---: |"
    )
    for row in rows:
        if row["calls"] >= events / 1000:
            query = " ".join(row["query"].split())[:90]
            print(
                f"| `{query}` | {row['calls'] / events:.3f} | {row['rows'] / events:.3f} "
                f"| {row['total_exec_time'] / events:.4f} | {row['max_exec_time']:.1f} |"
            )
    print(
        f"| all statements | {sum(r['calls'] for r in rows) / events:.3f} | | "
        f"{sum(r['total_exec_time'] for r in rows) / events:.4f} |"
    )
    print("| Redis command | calls / event | | µs / event |")
    for name, stats in sorted(commands.items(), key=lambda item: -item[1]["calls"]):
        print(f"| {name.removeprefix('cmdstat_')} | {stats['calls'] / events:.3f} | | {stats['usec'] / events:.1f} |")
    print("CPU ms per event: " + ", ".join(f"{name} {1000 * s / events:.3f}" for name, s in shares.items()))


async def profile(pids: list[int]) -> list[asyncio.subprocess.Process]:
    """`py-spy record` of each worker while the events run, when STATEMENTS_PY_SPY names py-spy: collapsed
    stacks in STATEMENTS_PROFILE_DIR (default /tmp), `worker-PID.txt`."""
    py_spy = os.environ.get("STATEMENTS_PY_SPY")
    if not py_spy:
        return []
    folder = os.environ.get("STATEMENTS_PROFILE_DIR", "/tmp")
    return [
        await asyncio.create_subprocess_exec(
            py_spy,
            "record",
            "--nonblocking",
            "--format",
            "raw",
            "-r",
            "200",
            "-o",
            f"{folder}/worker-{pid}.txt",
            "-p",
            str(pid),
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        for pid in pids
    ]


if __name__ == "__main__":
    asyncio.run(measure())
