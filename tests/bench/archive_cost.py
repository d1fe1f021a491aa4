"""What the event archive costs (issue 22, item 3): the same events end to
end through one deployment, to a source that is archived and to one that
is not (`retention = "0d"`), runs of each in turn.

One deployment (the processes `webhook-ingest run` starts), two sources
alike but for their retention, the bench's handler (one row through the
completion's transaction). Each run sends RUN_EVENTS unique events through
the ingress as fast as it takes them and is timed from the first send to
the last message acked (the workers' own counts: no polling of Postgres,
whose CPU is measured); the CPU of every process over a run is read as the
end-to-end phase reads it, until SETTLE_SECONDS after the last ack (both
kinds of run alike: the archive's rows are written by then). Postgres's
share is also split into its processes serving the bench's database (its
sessions, the autovacuum of its tables) and the shared ones (WAL writer,
checkpointer: they serve whatever else runs on the machine too). Runs go
off, on, on, off (ROUNDS of each, BENCH_ARCHIVE_ROUNDS): the database
grows, and order cancels a steady drift where "off, on" twice had
charged it to the archive. Each run ends with a VACUUM of the database,
inside its measure: this server runs no autovacuum, and without one the
workers' own statements got dearer run after run (Postgres's CPU per event
0.19 -> 0.51 ms over eight runs); with it each run pays its own vacuum
debt, the archive's dead row versions included, as it would where
autovacuum runs. Not ANALYZE: it samples every table, the archive's
expression index included, on every run whatever changed (35 % of
Postgres's CPU in one run).

Reported: events/s of each and their ratio (`archive_e2e_ratio`, the goal
at least 0.9), CPU ms per event of each process for each and their ratios
(`archive_cpu_ratio_<process>`, the goal at most 1.15), the archive's bytes
on disk per event, and whether every archived event's row says processed.
"""

import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

import asyncpg

from tests.bench import httpload
from tests.bench.cpu import CpuMeter, cpu_seconds, service_pids
from tests.bench.deployment import SECRET, Deployment, source_entry
from tests.support.exactly_once import until_every_message_handled
from tests.support.processes import wait_until

ARCHIVED, PLAIN = "kept", "plain"
SOURCES = {
    ARCHIVED: source_entry(ARCHIVED, "tests.bench.handler:record"),
    PLAIN: source_entry(PLAIN, "tests.bench.handler:record") + 'retention = "0d"\n',
}
RUN_EVENTS, WARM_UP = 10_000, 2_000
# BENCH_ARCHIVE_ROUNDS: rounds of (off, on) pairs; more of them to read a ratio through a noisy machine
ROUNDS = int(os.environ.get("BENCH_ARCHIVE_ROUNDS", "2"))
# What autovacuum does where it runs (this server runs none: without it the
# workers' statements got dearer run after run), within each run's measure.
VACUUM = "VACUUM"
SETTLE_SECONDS = 2.0  # the writers' lingering and a batch's write, after the last ack
# BENCH_ARCHIVE_DROP_INDEXES: the archive's indexes (comma-separated) dropped after migrating, to weigh them
DROPPED = [name for name in os.environ.get("BENCH_ARCHIVE_DROP_INDEXES", "").split(",") if name]
PROCESSES = ("ingress", "workers", "beam", "redis_server", "postgres")
POSTGRES_PARTS = ("postgres_ours", "postgres_shared")

ROWS = [
    ("archive_plain_events_per_s", f"archive off: end to end events/s ({RUN_EVENTS:,} × {ROUNDS})", "{:,.0f}"),
    ("archive_kept_events_per_s", f"archive on: end to end events/s ({RUN_EVENTS:,} × {ROUNDS})", "{:,.0f}"),
    ("archive_e2e_ratio", "archive on / off: events/s (goal ≥ 0.90)", "{:.3f}"),
    ("archive_plain_cpu_ms_total", "archive off: CPU ms per event, every process", "{:.3f}"),
    ("archive_kept_cpu_ms_total", "archive on: CPU ms per event, every process", "{:.3f}"),
    *[
        (f"archive_cpu_ratio_{name}", f"archive on / off: CPU per event, {name} (goal ≤ 1.15)", "{:.3f}")
        for name in (*PROCESSES, *POSTGRES_PARTS, "total")
    ],
    ("archive_e2e_ratio_median", "archive on / off: events/s, the median of the rounds' ratios", "{:.3f}"),
    *[
        (
            f"archive_cpu_ratio_median_{name}",
            f"archive on / off: CPU per event, {name}, the median of the rounds'",
            "{:.3f}",
        )
        for name in PROCESSES
    ],
    *[
        (f"archive_{source}_cpu_ms_{name}", f"archive {state}: CPU ms per event, {name}", "{:.3f}")
        for name in (*PROCESSES, *POSTGRES_PARTS)
        for source, state in (("plain", "off"), ("kept", "on"))
    ],
    ("archive_bytes_per_event", "archive: bytes on disk per 1 KiB event", "{:,.0f}"),
    ("archive_rows_not_processed", "archived events whose row is not `processed`", "{:.0f}"),
]


async def measure(figures: dict) -> None:
    async with Deployment(sources="".join(SOURCES.values())) as deployment:
        for index in DROPPED:  # a candidate's price: the same run without these
            await deployment.fetchval(f"DROP INDEX {index}")
        await deployment.start_ingress()
        await deployment.start_workers()
        meter = CpuMeter(deployment.pids(), deployment.database_name, deployment.redis_port)
        handled = 0
        for source in (PLAIN, ARCHIVED):  # connections, caches, each source's first days
            handled = await send(deployment, source, f"warm_{source}_", WARM_UP, handled)
        vacuum = await asyncpg.connect(deployment.database_url)  # its backend is one of the metered
        try:
            await vacuum.execute(VACUUM)
            await meter.measure_background()
            runs: dict[str, list[tuple[float, dict[str, float]]]] = {PLAIN: [], ARCHIVED: []}
            for round_ in range(ROUNDS):
                for source in (PLAIN, ARCHIVED) if round_ % 2 == 0 else (ARCHIVED, PLAIN):
                    meter.start()
                    postgres = PostgresParts(deployment.database_name)
                    started = time.perf_counter()
                    handled = await send(deployment, source, f"r{round_}_", RUN_EVENTS, handled)
                    elapsed = time.perf_counter() - started
                    await asyncio.sleep(SETTLE_SECONDS)
                    await vacuum.execute(VACUUM)  # the run's own vacuum debt, charged to it
                    runs[source].append((elapsed, meter.stop() | postgres.seconds()))
                    print_run(round_, source, elapsed, runs[source][-1][1])
        finally:
            await vacuum.close()
        await until_archived(deployment, f"r{ROUNDS - 1}_")
        await report(deployment, runs, figures)


async def send(deployment: Deployment, source: str, prefix: str, count: int, handled: int) -> int:
    """`count` events through the ingress, until every one is acked; the workers' running count."""
    requests = httpload.signed_requests(source, SECRET, prefix, count)
    _, _, statuses = await httpload.closed_loop(deployment.ingress_port, requests)
    if set(statuses) != {200}:
        raise SystemExit(f"FAIL: archive cost, {source}: the ingress answered {statuses}")
    handled += count
    await until_every_message_handled([url for _, url in deployment.workers], handled, timeout=300)
    return handled


def print_run(round_: int, source: str, elapsed: float, cpu: dict[str, float]) -> None:
    """Each run as it ends, to stderr: a ratio's spread across rounds shows the machine's noise."""
    per_event = {name: 1000 * cpu.get(_meter_name(name), 0.0) / RUN_EVENTS for name in PROCESSES}
    shown = " ".join(f"{name} {ms:.3f}" for name, ms in per_event.items())
    print(
        f"archive round {round_} {source}: {RUN_EVENTS / elapsed:,.0f} events/s; CPU ms per event: {shown}",
        file=sys.stderr,
    )


async def until_archived(deployment: Deployment, prefix: str) -> None:
    async def written() -> bool:
        return await processed_rows(deployment, prefix) >= RUN_EVENTS

    await wait_until(written, 60, interval=0.1, message=f"{RUN_EVENTS} archived rows processed")


async def processed_rows(deployment: Deployment, prefix: str) -> int:
    return await deployment.fetchval(
        "SELECT count(*) FROM event_archive WHERE source = $1 AND status = 'processed' AND key LIKE $2",
        ARCHIVED,
        f"{ARCHIVED}:{prefix}%",
    )


async def report(deployment: Deployment, runs: dict, figures: dict) -> None:
    for source, measured in runs.items():
        events = RUN_EVENTS * len(measured)
        figures[f"archive_{source}_events_per_s"] = events / sum(elapsed for elapsed, _ in measured)
        for name in (*PROCESSES, *POSTGRES_PARTS):
            seconds = sum(cpu.get(_meter_name(name), 0.0) for _, cpu in measured)
            figures[f"archive_{source}_cpu_ms_{name}"] = 1000 * seconds / events
        figures[f"archive_{source}_cpu_ms_total"] = sum(figures[f"archive_{source}_cpu_ms_{n}"] for n in PROCESSES)
    figures["archive_e2e_ratio"] = figures["archive_kept_events_per_s"] / figures["archive_plain_events_per_s"]
    for name in (*PROCESSES, *POSTGRES_PARTS, "total"):
        plain = figures[f"archive_plain_cpu_ms_{name}"]
        figures[f"archive_cpu_ratio_{name}"] = figures[f"archive_kept_cpu_ms_{name}"] / plain if plain else 0.0
    report_round_medians(runs, figures)
    archived = WARM_UP + RUN_EVENTS * ROUNDS
    size = await deployment.fetchval(
        "SELECT coalesce(sum(pg_total_relation_size(relid)), 0)::int8 FROM pg_partition_tree('event_archive')"
        " WHERE isleaf"
    )
    figures["archive_bytes_per_event"] = size / archived
    figures["archive_rows_not_processed"] = sum(
        [RUN_EVENTS - await processed_rows(deployment, f"r{n}_") for n in range(ROUNDS)]
    )
    sent = 2 * (WARM_UP + RUN_EVENTS * ROUNDS)
    distinct = await deployment.fetchval("SELECT count(DISTINCT key) FROM bench_effects")
    rows = await deployment.fetchval("SELECT count(*) FROM bench_effects")
    figures["lost"] = figures.get("lost", 0) + sent - distinct
    figures["duplicated_effects"] = figures.get("duplicated_effects", 0) + rows - distinct


def report_round_medians(runs: dict, figures: dict) -> None:
    """Each round's on / off ratio, their median: the totals' ratio above
    weighs a round the machine's load slowed more; a median across rounds
    reads the archive through one such round."""
    pairs = list(zip(runs[PLAIN], runs[ARCHIVED]))
    figures["archive_e2e_ratio_median"] = statistics.median(off[0] / on[0] for off, on in pairs)
    for name in PROCESSES:
        ratios = [
            on[1].get(_meter_name(name), 0.0) / off[1][_meter_name(name)]
            for off, on in pairs
            if off[1].get(_meter_name(name))
        ]
        figures[f"archive_cpu_ratio_median_{name}"] = statistics.median(ratios) if ratios else 0.0


class PostgresParts:
    """Postgres's CPU over a run, split: the processes serving the bench's
    database (its sessions, and autovacuum workers on it) and the rest
    (WAL writer, checkpointer, … — and other databases' autovacuum). Not
    corrected for the background, unlike CpuMeter's total."""

    def __init__(self, database: str):
        self._database = database
        self._before = self._read()

    def _read(self) -> dict[str, dict[int, float]]:
        parts: dict[str, dict[int, float]] = {part: {} for part in POSTGRES_PARTS}
        for pid in service_pids(self._database, 0)["postgres"]:
            try:
                ours = self._database in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            parts["postgres_ours" if ours else "postgres_shared"][pid] = cpu_seconds(pid)
        return parts

    def seconds(self) -> dict[str, float]:
        after = self._read()
        return {
            part: sum(cpu - self._before[part].get(pid, 0.0) for pid, cpu in after[part].items())
            for part in POSTGRES_PARTS
        }


def _meter_name(name: str) -> str:
    """CpuMeter's names: ours, and the services' process names."""
    return {"beam": "beam.smp", "redis_server": "redis-server"}.get(name, name)
