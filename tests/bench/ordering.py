"""What ordering keys cost (issue 38, item 5; docs/design.md, "Ordering
keys"): `python -m tests.bench --phase ordering`.

One deployment (the processes `webhook-ingest run` starts), four sources
alike but for their handler and whether they are ordered
(`ordering = { key = "body:object" }`), each source's runs in turn:

- **spread**: SPREAD_EVENTS unique events over SPREAD_KEYS objects (two
  events an object, sent 10,000 requests apart) to `plain` and to
  `ordered`, the bench's handler (`record`: one row through the completion
  transaction, batchable). Events/s end to end of each, from the first send
  to the last effect committed, and their ratio `ordered_vs_unordered`
  (goal at least 0.8);
- **hot key**: HOT_EVENTS events of one object to `hot_ordered`, a 5 ms
  handler (`record_after_work`: 5 ms, then `record`'s row): events/s
  against the handler's own rate one at a time (1 / 5 ms = 200/s),
  `hot_key_vs_handler` (goal at least 0.8); and the same events to
  `hot_plain` (not ordered: they run side by side), whose CPU per event
  over every process is the base of `cpu_vs_unordered` (goal at most 1.5:
  a lane waiting on its head costs no polling).

The events are sent through the ingress as fast as it takes them (64
connections), so a backlog forms. Each run's CPU is read as the
end-to-end phase reads it (every process, the services' background taken
off), until SETTLE_SECONDS after its last effect plus a VACUUM (this server
runs no autovacuum; each run pays its own dead rows, the ordered rows a
completion deletes among them: tests/bench/archive_cost.py says why).
Figures only: no goal is asserted. Rows left in `ordered_events` after the
runs (`ordering_rows_left`) should be 0.
"""

import asyncio
import time

import asyncpg

from tests.bench import httpload
from tests.bench.cpu import CpuMeter
from tests.bench.deployment import SECRET, Deployment, source_entry
from tests.bench.handler import HOT_KEY_HANDLER_SECONDS
from tests.support.processes import wait_until

PLAIN, ORDERED, HOT_PLAIN, HOT_ORDERED = "plain", "ordered", "hot_plain", "hot_ordered"
RECORD, RECORD_AFTER_WORK = "tests.bench.handler:record", "tests.bench.handler:record_after_work"
ORDERING = '[sources.{name}.ordering]\nkey = "body:object"\n'
SOURCES = "".join(
    [
        source_entry(PLAIN, RECORD),
        source_entry(ORDERED, RECORD) + ORDERING.format(name=ORDERED),
        source_entry(HOT_PLAIN, RECORD_AFTER_WORK),
        source_entry(HOT_ORDERED, RECORD_AFTER_WORK) + ORDERING.format(name=HOT_ORDERED),
    ]
)
SPREAD_EVENTS, SPREAD_KEYS = 20_000, 10_000
HOT_EVENTS = 1_000
WARM_UP = 1_000  # events of each source first (the hot sources': over one object too), not measured
HANDLER_RATE = 1 / HOT_KEY_HANDLER_SECONDS
SETTLE_SECONDS = 1.0  # after the last effect: a lane's release, the last batch's statements
RUN_TIMEOUT = 300.0  # a run not done by then is measured on what it finished (`ordering_unfinished`)
DRAIN_TIMEOUT = 900.0  # then its backlog drains, unmeasured, before the next run
PROCESSES = ("ingress", "workers", "beam.smp", "redis-server", "postgres")

ROWS = [
    ("ordering_plain_events_per_s", f"ordering off: events/s ({SPREAD_EVENTS:,} over {SPREAD_KEYS:,})", "{:,.0f}"),
    ("ordering_ordered_events_per_s", f"ordering on: events/s ({SPREAD_EVENTS:,} over {SPREAD_KEYS:,})", "{:,.0f}"),
    ("ordered_vs_unordered", "ordering on / off: events/s (goal ≥ 0.8)", "{:.2f}"),
    ("ordering_plain_cpu_ms_per_event", "ordering off: CPU ms per event, every process", "{:.3f}"),
    ("ordering_ordered_cpu_ms_per_event", "ordering on: CPU ms per event, every process", "{:.3f}"),
    ("spread_cpu_vs_unordered", "ordering on / off: CPU per event", "{:.2f}"),
    ("ordering_hot_ordered_events_per_s", f"one hot key, 5 ms handler: events/s ({HOT_EVENTS:,})", "{:,.0f}"),
    ("hot_key_vs_handler", f"hot key / the handler's own {HANDLER_RATE:.0f}/s (goal ≥ 0.8)", "{:.2f}"),
    ("ordering_hot_plain_events_per_s", "the same events unordered: events/s", "{:,.0f}"),
    ("ordering_hot_ordered_cpu_ms_per_event", "hot key: CPU ms per event, every process", "{:.3f}"),
    ("ordering_hot_plain_cpu_ms_per_event", "the same unordered: CPU ms per event, every process", "{:.3f}"),
    ("cpu_vs_unordered", "hot key / unordered: CPU per event (goal ≤ 1.5)", "{:.2f}"),
    *[
        (f"ordering_hot_ordered_cpu_ms_{_name}", f"hot key: CPU ms per event, {_name}", "{:.3f}")
        for _name in ("ingress", "workers", "beam", "redis_server", "postgres")
    ],
    ("ordering_rows_left", "ordered rows left after the runs (0)", "{:.0f}"),
    ("ordering_unfinished", f"events not done within a run's {RUN_TIMEOUT:.0f} s (0)", "{:,.0f}"),
]


async def measure(figures: dict) -> None:
    async with Deployment(sources=SOURCES) as deployment:
        await deployment.start_ingress()
        await deployment.start_workers()
        meter = CpuMeter(deployment.pids(), deployment.database_name, deployment.redis_port)
        for source, objects in ((PLAIN, WARM_UP), (ORDERED, WARM_UP), (HOT_PLAIN, 1), (HOT_ORDERED, 1)):
            warm_up = WARM_UP if objects > 1 else HOT_EVENTS // 10
            if (await send(deployment, source, "warm_", warm_up, objects))[1] < warm_up:
                await drained(deployment, source, "warm_", warm_up)
        vacuum = await asyncpg.connect(deployment.database_url)  # its backend is one of the metered
        try:
            await vacuum.execute("VACUUM")
            await meter.measure_background()
            for source, events, objects in (
                (PLAIN, SPREAD_EVENTS, SPREAD_KEYS),
                (ORDERED, SPREAD_EVENTS, SPREAD_KEYS),
                (HOT_PLAIN, HOT_EVENTS, 1),
                (HOT_ORDERED, HOT_EVENTS, 1),
            ):
                meter.start()
                elapsed, done = await send(deployment, source, "run_", events, objects)
                await asyncio.sleep(SETTLE_SECONDS)
                await vacuum.execute("VACUUM")
                record_run(figures, source, done, elapsed, meter.stop())
                figures["ordering_unfinished"] = figures.get("ordering_unfinished", 0) + events - done
                if done < events:
                    await drained(deployment, source, "run_", events)
        finally:
            await vacuum.close()
        for source in (PLAIN, ORDERED, HOT_PLAIN, HOT_ORDERED):
            await count_outcome(deployment, source, figures)
        figures["ordering_rows_left"] = await deployment.fetchval("SELECT count(*) FROM ordered_events")
    ratios(figures)


async def send(deployment: Deployment, source: str, prefix: str, events: int, objects: int) -> tuple[float, int]:
    """`events` events over `objects` objects through the ingress, until
    every effect is committed or RUN_TIMEOUT: seconds from the first send to
    the last effect (or to the timeout), and the effects committed by then."""
    requests = httpload.signed_requests(source, SECRET, f"{prefix}", events, objects=objects)
    started = time.perf_counter()
    _, _, statuses = await httpload.closed_loop(deployment.ingress_port, requests)
    if set(statuses) != {200}:
        raise SystemExit(f"FAIL: ordering, {source}: the ingress answered {statuses}")

    async def committed() -> bool:
        return await effects(deployment, source, prefix) >= events

    try:
        await wait_until(committed, RUN_TIMEOUT, interval=0.05, message=f"{events} {source} {prefix} effects")
    except AssertionError:
        elapsed = time.perf_counter() - started
        return elapsed, await effects(deployment, source, prefix)
    return time.perf_counter() - started, events


async def drained(deployment: Deployment, source: str, prefix: str, events: int) -> None:
    """A run's backlog, done (unmeasured) before the next run starts."""

    async def committed() -> bool:
        return await effects(deployment, source, prefix) >= events

    await wait_until(committed, DRAIN_TIMEOUT, interval=0.5, message=f"{events} {source} {prefix} effects, drained")


def record_run(figures: dict, source: str, events: int, elapsed: float, cpu: dict[str, float]) -> None:
    figures[f"ordering_{source}_events_per_s"] = events / elapsed
    figures[f"ordering_{source}_cpu_ms_per_event"] = 1000 * sum(cpu.values()) / events
    for name in PROCESSES:
        figures[f"ordering_{source}_cpu_ms_{name.split('.')[0].replace('-', '_')}"] = 1000 * cpu.get(name, 0.0) / events


def ratios(figures: dict) -> None:
    figures["ordered_vs_unordered"] = figures["ordering_ordered_events_per_s"] / figures["ordering_plain_events_per_s"]
    figures["spread_cpu_vs_unordered"] = (
        figures["ordering_ordered_cpu_ms_per_event"] / figures["ordering_plain_cpu_ms_per_event"]
    )
    figures["hot_key_vs_handler"] = figures["ordering_hot_ordered_events_per_s"] / HANDLER_RATE
    figures["cpu_vs_unordered"] = (
        figures["ordering_hot_ordered_cpu_ms_per_event"] / figures["ordering_hot_plain_cpu_ms_per_event"]
    )


async def effects(deployment: Deployment, source: str, prefix: str) -> int:
    return await deployment.fetchval(
        "SELECT count(DISTINCT key) FROM bench_effects WHERE key LIKE $1", f"{source}:{prefix}%"
    )


async def count_outcome(deployment: Deployment, source: str, figures: dict) -> None:
    """Every event sent to `source` (warm-up and run), one effect each."""
    sent = (WARM_UP if source in (PLAIN, ORDERED) else HOT_EVENTS // 10) + (
        SPREAD_EVENTS if source in (PLAIN, ORDERED) else HOT_EVENTS
    )
    distinct = await deployment.fetchval(
        "SELECT count(DISTINCT key) FROM bench_effects WHERE key LIKE $1", f"{source}:%"
    )
    rows = await deployment.fetchval("SELECT count(*) FROM bench_effects WHERE key LIKE $1", f"{source}:%")
    figures["lost"] = figures.get("lost", 0) + sent - distinct
    figures["duplicated_effects"] = figures.get("duplicated_effects", 0) + rows - distinct
