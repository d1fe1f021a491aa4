"""`python -m tests.bench`: raw broker and raw pipeline, ingress throughput
and latency, end to end, duplicates (concurrent copies, and late copies of
completed events), recovery after a worker's kill -9, the broker blocked
(tests/bench/broker_blocked.py), handlers that wait on the network
(tests/bench/slow_handlers.py), the event archive's cost
(tests/bench/archive_cost.py), and OpenTelemetry tracing's
(tests/bench/tracing_cost.py, alone only), ordering keys' cost
(tests/bench/ordering.py, `--phase ordering`, alone only), the contract floor
(tests/bench/contract_floor.py; `--phase contract_floor` with ours end to end), with `--peers` the Celery and
Dramatiq stacks beside ours, a worker killed and paused (tests/bench/peers, tests/bench/faults.py; `--phase
pause` the pause alone); a table, then one JSON line. Exit 1 on a
lost or duplicated effect. `--phase broker-blocked`, `--phase slow` or
`--phase archive` runs that phase alone, with the archive's floor
(tests/bench/archive_floor.py; `--phase archive_floor` the floor alone; `--phase tracing` too; `--phase ingress`
`ingress_cpu_vs_floor` alone, tests/bench/ingress_floor.py); `--phase steady` every phase but the broker-blocked one
(to compare candidate layouts)."""

import argparse
import asyncio
import json
import os
import statistics
import sys
import time

from tests.bench import (
    archive_cost,
    archive_floor,
    archive_search,
    broker_blocked,
    contract_floor,
    durable_floor,
    guarantee_costs,
    http_floor,
    httpload,
    ingress_floor,
    ordering,
    raw_broker,
    raw_pipeline,
    slow_handlers,
    tracing_cost,
)
from tests.bench.cpu import CpuMeter, cpu_seconds
from tests.bench.deployment import CONCURRENCY, INGRESS_PROCESSES, SECRET, SOURCE, WORKERS, Deployment, peak_rss_mib
from tests.bench.peers import measure as peers
from tests.support.exactly_once import until_every_message_handled
from tests.support.processes import wait_until

RAW_MESSAGES = 15_000
INGRESS_SECONDS = 12
LATENCY_RATE, LATENCY_SECONDS = 1_000, 5
E2E_EVENTS = 20_000
DUP_EVENTS, DUP_COPIES = 2_000, 5
LATE_COPIES = 5_000
RECOVERY_RATE, RECOVERY_SECONDS = 400, 3
CONTRACT_ROUNDS = int(os.environ.get("BENCH_CONTRACT_ROUNDS", "1"))


async def main(with_outage: bool = True, with_peers: bool = False) -> int:
    figures: dict[str, float] = {"nproc": os.cpu_count()}
    async with Deployment() as deployment:
        with httpload.gc_paused():
            figures.update(
                await raw_broker.measure(
                    deployment.amqp_url, f"{deployment.namespace}.raw", RAW_MESSAGES, LATENCY_RATE, LATENCY_SECONDS
                )
            )
            figures.update(await raw_pipeline.measure(deployment.amqp_url, f"{deployment.namespace}.raw", RAW_MESSAGES))
            figures.update(
                await durable_floor.measure(
                    deployment.amqp_url,
                    f"{deployment.namespace}.floor",
                    deployment.database_url,
                    deployment.database_name,
                    deployment.redis_port,
                    RAW_MESSAGES,
                )
            )
        figures.update(await http_floor.measure(SOURCE, SECRET))
        await deployment.start_ingress()
        await ingress_phases(deployment, figures)
        await deployment.purge_events()  # the ingress phases' events: not part of what follows
        await deployment.start_workers()
        meter = CpuMeter(deployment.pids(), deployment.database_name, deployment.redis_port)
        await meter.measure_background()
        await end_to_end_phase(deployment, meter, figures)
        await duplicates_phase(deployment, figures)
        await late_duplicates_phase(deployment, meter, figures)
        figures["spooled_while_healthy"] = await outbox_inserts(deployment)
        figures["worker_rss_mib"] = max(peak_rss_mib(worker.pid) for worker, _ in deployment.workers)
        figures["ingress_rss_mib"] = max(peak_rss_mib(ingress.pid) for ingress in deployment.ingresses)
        await recovery_phase(deployment, figures)
    await contract_floor.measure(figures)  # its own processes, queue and database, ours stopped
    await slow_handlers.measure(figures)  # a deployment of its own, with four sources
    await archive_cost.measure(figures)  # a deployment of its own, with an archived source and one not
    await archive_floor.measure(figures)  # a database of its own; the budget from the archive phase's runs
    if with_outage:
        await broker_blocked.measure(figures)  # a deployment of its own, on a private broker
    if with_peers:
        await peers.measure(figures)  # the Celery and Dramatiq stacks, in a venv of their own
    figures["ingress_vs_raw"] = figures["ingress_rps"] / figures["raw_publish_rps"]
    figures["e2e_vs_raw"] = figures["e2e_events_per_s"] / figures["raw_consume_rps"]
    figures["e2e_vs_raw_pipeline"] = figures["e2e_events_per_s"] / figures["raw_pipeline_rps"]
    figures["ingress_p99_vs_raw"] = figures["ingress_p99_ms"] / figures["raw_publish_p99_ms"]
    figures["e2e_vs_durable_floor"] = figures["e2e_events_per_s"] / figures["durable_floor_rps"]
    figures["cpu_vs_durable_floor"] = figures["total_cpu_ms_per_event"] / figures["durable_floor_cpu_ms"]
    contract_ratios(figures)
    if with_peers:
        peers.ratios(figures)
    figures["ingress_cpu_vs_floor"] = figures["ingress_cpu_ms_per_request"] / (
        figures["http_floor_cpu_ms"] + figures["raw_publish_cpu_ms_client"]
    )
    return report(figures)


def contract_ratios(figures: dict) -> None:
    """Ours against the contract floor of the same run (tests/bench/contract_floor.py)."""
    if "contract_floor_events_per_s" in figures:
        figures["e2e_vs_contract_floor"] = figures["e2e_events_per_s"] / figures["contract_floor_events_per_s"]
        figures["cpu_vs_contract_floor"] = figures["total_cpu_ms_per_event"] / figures["contract_floor_cpu_ms"]


async def contract_floor_alone(with_peers: bool = False) -> int:
    """`--phase contract_floor`: ours end to end (a deployment of its own,
    warmed with 2,000 events first, as the floor is) and the contract floor,
    one after the other on the same services, BENCH_CONTRACT_ROUNDS times,
    each round in the opposite order of the one before; each figure and
    ratio the median of the rounds' (a ratio paired within its round); with
    `--peers`, the peers after them."""
    figures: dict[str, float] = {"nproc": os.cpu_count()}
    rounds = []
    for number in range(CONTRACT_ROUNDS):
        found: dict[str, float] = {}
        steps = [ours_end_to_end, contract_floor.measure]
        for step in steps if number % 2 == 0 else reversed(steps):
            await step(found)
        contract_ratios(found)
        rounds.append(found)
    for key in rounds[0]:
        summed = key in ("lost", "duplicated_effects")
        figures[key] = sum(r[key] for r in rounds) if summed else statistics.median(r[key] for r in rounds)
    if with_peers:
        await peers.measure(figures)
        peers.ratios(figures)
    return report(figures)


async def ours_end_to_end(figures: dict) -> None:
    async with Deployment() as deployment:
        await deployment.start_ingress()
        await deployment.start_workers()
        await httpload.closed_loop(deployment.ingress_port, httpload.signed_requests(SOURCE, SECRET, "warm_", 2_000))
        await until_effects(deployment, "warm_", 2_000)
        deployment.handled = 2_000
        await until_handled(deployment, deployment.handled)
        meter = CpuMeter(deployment.pids(), deployment.database_name, deployment.redis_port)
        await meter.measure_background()
        await end_to_end_phase(deployment, meter, figures)


async def guarantee_costs_alone() -> int:
    """`--phase guarantee_costs`: the contract floor with each guarantee added (tests/bench/guarantee_costs.py)."""
    figures: dict[str, float] = {"nproc": os.cpu_count()}
    await guarantee_costs.measure(figures)
    return report(figures)


async def ingress_phases(deployment: Deployment, figures: dict) -> None:
    """A fixed offered rate for latency, counted from each scheduled send,
    on an empty queue (as the raw broker's was); then a closed loop of 64
    connections sending unique events for throughput."""
    requests = httpload.signed_requests(SOURCE, SECRET, "warm_", 2_000)
    await httpload.closed_loop(deployment.ingress_port, requests)  # warm-up: connections, caches
    await deployment.purge_events()

    requests = httpload.signed_requests(SOURCE, SECRET, "rate_", LATENCY_RATE * LATENCY_SECONDS)
    with httpload.gc_paused():
        latencies, statuses = await httpload.open_loop(deployment.ingress_port, requests, LATENCY_RATE)
    check_statuses("ingress latency", statuses)
    latencies.sort()
    figures["ingress_p50_ms"] = 1000 * latencies[len(latencies) // 2]
    figures["ingress_p99_ms"] = 1000 * latencies[int(len(latencies) * 0.99)]

    requests = httpload.signed_requests(SOURCE, SECRET, "load_", 8_000 * INGRESS_SECONDS)
    cpu_before, client_before = ingress_cpu(deployment), time.process_time()
    with httpload.gc_paused():
        sent, elapsed, statuses = await httpload.closed_loop(deployment.ingress_port, requests, seconds=INGRESS_SECONDS)
    check_statuses("ingress throughput", statuses)
    figures["ingress_rps"] = sent / elapsed
    figures["ingress_cpu_ms_per_request"] = 1000 * (ingress_cpu(deployment) - cpu_before) / sent
    figures["load_client_cpu_ms_per_request"] = 1000 * (time.process_time() - client_before) / sent


async def end_to_end_phase(deployment: Deployment, meter: CpuMeter, figures: dict) -> None:
    """20,000 unique events through the ingress, from the first send to the
    last effect committed; CPU per event in the workers, and summed over
    every process an event passes through."""
    requests = httpload.signed_requests(SOURCE, SECRET, "e2e_", E2E_EVENTS)
    cpu_before = workers_cpu(deployment)
    meter.start()
    started = time.perf_counter()
    _, _, statuses = await httpload.closed_loop(deployment.ingress_port, requests)
    check_statuses("end to end", statuses)
    await until_effects(deployment, "e2e_", E2E_EVENTS)
    figures["e2e_events_per_s"] = E2E_EVENTS / (time.perf_counter() - started)
    deployment.handled += E2E_EVENTS
    await until_handled(deployment, deployment.handled)
    figures["worker_cpu_ms_per_event"] = 1000 * (workers_cpu(deployment) - cpu_before) / E2E_EVENTS
    shares = meter.stop()
    figures["total_cpu_ms_per_event"] = 1000 * sum(shares.values()) / E2E_EVENTS
    for name, seconds in shares.items():
        figures[f"e2e_cpu_ms_{name.split('.')[0].replace('-', '_')}"] = 1000 * seconds / E2E_EVENTS
    await count_outcome(deployment, "e2e_", E2E_EVENTS, figures)


async def duplicates_phase(deployment: Deployment, figures: dict) -> None:
    """2,000 new events × 5 copies, copies sent together: most reach the
    workers before their first completed (the ingress answers `duplicate`
    only for a completed key). A copy's worker CPU against a fresh event's."""
    requests = httpload.signed_requests(SOURCE, SECRET, "dup_", DUP_EVENTS, copies=DUP_COPIES)
    answered_before = httpload.Connection.duplicates
    cpu_before = workers_cpu(deployment)
    started = time.perf_counter()
    _, _, statuses = await httpload.closed_loop(deployment.ingress_port, requests)
    check_statuses("duplicates", statuses)
    queued = DUP_EVENTS * DUP_COPIES - (httpload.Connection.duplicates - answered_before)
    deployment.handled += queued
    await until_handled(deployment, deployment.handled)
    figures["dup_events_per_s"] = DUP_EVENTS * DUP_COPIES / (time.perf_counter() - started)
    fresh_cost = figures["worker_cpu_ms_per_event"]
    duplicates_cpu_ms = 1000 * (workers_cpu(deployment) - cpu_before) - DUP_EVENTS * fresh_cost
    figures["dup_cost_vs_fresh"] = duplicates_cpu_ms / (queued - DUP_EVENTS) / fresh_cost
    await count_outcome(deployment, "dup_", DUP_EVENTS, figures)


async def late_duplicates_phase(deployment: Deployment, meter: CpuMeter, figures: dict) -> None:
    """5,000 copies of events completed in the end-to-end phase (a provider's
    retry after a lost answer): their CPU summed over every process, against
    a fresh event's; the copies the ingress could not answer go through."""
    requests = httpload.signed_requests(SOURCE, SECRET, "e2e_", LATE_COPIES)
    answered_before = httpload.Connection.duplicates
    rows_before = await effect_rows(deployment, "e2e_")
    meter.start()
    started = time.perf_counter()
    _, _, statuses = await httpload.closed_loop(deployment.ingress_port, requests)
    check_statuses("late duplicates", statuses)
    answered = httpload.Connection.duplicates - answered_before
    deployment.handled += LATE_COPIES - answered
    await until_handled(deployment, deployment.handled)
    elapsed = time.perf_counter() - started
    total_ms = 1000 * sum(meter.stop().values())
    figures["late_dup_per_s"] = LATE_COPIES / elapsed
    figures["late_dup_answered_at_ingress"] = answered / LATE_COPIES
    figures["dup_total_cost_vs_fresh"] = total_ms / LATE_COPIES / figures["total_cpu_ms_per_event"]
    # a copy of a completed event must add no effect
    figures["duplicated_effects"] += await effect_rows(deployment, "e2e_") - rows_before


async def recovery_phase(deployment: Deployment, figures: dict) -> None:
    """400 events/s for 3 s, and kill -9 of one worker as the last request
    is sent, while events are in flight (`recovery_pending_at_kill`:
    answered 200 and without effect then, at least 0); `recovery_s` from the
    kill until every accepted event's effect is committed (the other worker
    takes the killed one's over; one the victim had leased waits for its
    lease to run out)."""
    prefix, count = "rec_", RECOVERY_RATE * RECOVERY_SECONDS
    requests = httpload.signed_requests(SOURCE, SECRET, prefix, count)
    answered: dict[int, int] = {}
    load = asyncio.create_task(httpload.open_loop(deployment.ingress_port, requests, RECOVERY_RATE, statuses=answered))
    await asyncio.sleep(RECOVERY_SECONDS)
    victim, _ = deployment.workers[0]
    victim.kill()
    killed = time.perf_counter()
    figures["recovery_pending_at_kill"] = max(0, answered.get(200, 0) - await effects(deployment, prefix))
    _, statuses = await load
    check_statuses("recovery", statuses)
    await until_effects(deployment, prefix, count)
    figures["recovery_s"] = time.perf_counter() - killed
    distinct, rows = await effects(deployment, prefix), await effect_rows(deployment, prefix)
    figures["recovery_lost"], figures["recovery_duplicated"] = count - distinct, rows - distinct
    await count_outcome(deployment, prefix, count, figures)


async def outbox_inserts(deployment: Deployment) -> int:
    """Events the ingress sent to the outbox, although the broker was up
    throughout: a confirm later than the ingress's patience, or a crowd."""
    return await deployment.fetchval(
        "SELECT coalesce(sum(n_tup_ins), 0)::int FROM pg_stat_user_tables WHERE relname = 'outbox'"
    )


def ingress_cpu(deployment: Deployment) -> float:
    return sum(cpu_seconds(ingress.pid) for ingress in deployment.ingresses)


def workers_cpu(deployment: Deployment) -> float:
    return sum(cpu_seconds(worker.pid) for worker, _ in deployment.workers)


async def effects(deployment: Deployment, prefix: str) -> int:
    return await deployment.fetchval(
        "SELECT count(DISTINCT key) FROM bench_effects WHERE key LIKE $1", f"{SOURCE}:{prefix}%"
    )


async def until_effects(deployment: Deployment, prefix: str, count: int) -> None:
    async def committed() -> bool:
        return await effects(deployment, prefix) >= count

    await wait_until(committed, 180, interval=0.05, message=f"{count} {prefix} effects")


async def until_handled(deployment: Deployment, messages: int) -> None:
    await until_every_message_handled([url for _, url in deployment.workers], messages)


async def effect_rows(deployment: Deployment, prefix: str) -> int:
    return await deployment.fetchval("SELECT count(*) FROM bench_effects WHERE key LIKE $1", f"{SOURCE}:{prefix}%")


async def count_outcome(deployment: Deployment, prefix: str, expected: int, figures: dict) -> None:
    distinct = await effects(deployment, prefix)
    rows = await effect_rows(deployment, prefix)
    figures["lost"] = figures.get("lost", 0) + expected - distinct
    figures["duplicated_effects"] = figures.get("duplicated_effects", 0) + rows - distinct


def check_statuses(phase: str, statuses: dict[int, int]) -> None:
    if set(statuses) != {200}:
        raise SystemExit(f"FAIL: {phase}: the ingress answered {statuses}")


ROWS = [  # (key, label, format)
    ("raw_publish_rps", "raw broker: confirmed publishes/s (256 in flight)", "{:,.0f}"),
    ("raw_consume_rps", "raw broker: consumed + acked/s", "{:,.0f}"),
    ("raw_publish_p99_ms", f"raw broker: confirm p99 ms at {LATENCY_RATE:,}/s offered", "{:.2f}"),
    ("raw_publish_cpu_ms_broker", "raw broker: broker CPU ms per confirmed publish", "{:.3f}"),
    ("raw_pipeline_rps", "raw pipeline: published + consumed/s, concurrently", "{:,.0f}"),
    ("raw_pipeline_cpu_ms_broker", "raw pipeline: broker CPU ms per message", "{:.3f}"),
    ("raw_pipeline_cpu_ms_clients", "raw pipeline: publisher + consumer CPU ms per message", "{:.3f}"),
    ("durable_floor_rps", "durable floor: published + committed + acked/s", "{:,.0f}"),
    ("durable_floor_cpu_ms", "durable floor: CPU ms per message, every process", "{:.3f}"),
    ("http_floor_cpu_ms", "bare aiohttp server: CPU ms per request (fixed 200)", "{:.3f}"),
    ("ingress_rps", f"ingress: accepted req/s (64 conns, {INGRESS_PROCESSES} processes)", "{:,.0f}"),
    ("ingress_vs_raw", "ingress / raw publish", "{:.2f}"),
    ("ingress_cpu_ms_per_request", "ingress: CPU ms per request", "{:.3f}"),
    ("ingress_cpu_vs_floor", "ingress CPU / (bare aiohttp + confirmed publish)", "{:.2f}"),
    ("load_client_cpu_ms_per_request", "load client: CPU ms per request", "{:.3f}"),
    ("ingress_p50_ms", f"ingress p50 ms at {LATENCY_RATE:,} req/s offered", "{:.2f}"),
    ("ingress_p99_ms", f"ingress p99 ms at {LATENCY_RATE:,} req/s offered", "{:.2f}"),
    ("ingress_p99_vs_raw", "ingress p99 / raw broker confirm p99", "{:.2f}"),
    ("e2e_events_per_s", f"end to end: events/s ({E2E_EVENTS:,} unique)", "{:,.0f}"),
    ("e2e_vs_raw", "end to end / raw consume", "{:.2f}"),
    ("e2e_vs_raw_pipeline", "end to end / raw pipeline", "{:.2f}"),
    ("e2e_vs_durable_floor", "end to end / durable floor", "{:.2f}"),
    ("worker_cpu_ms_per_event", "workers: CPU ms per fresh event", "{:.3f}"),
    ("total_cpu_ms_per_event", "every process: CPU ms per fresh event", "{:.3f}"),
    ("cpu_vs_durable_floor", "every process's CPU per event / durable floor's", "{:.2f}"),
    ("dup_events_per_s", f"duplicates: messages/s ({DUP_EVENTS:,} × {DUP_COPIES})", "{:,.0f}"),
    ("dup_cost_vs_fresh", "a concurrent copy's worker CPU / a fresh event's", "{:.2f}"),
    ("late_dup_per_s", f"late copies of completed events/s ({LATE_COPIES:,})", "{:,.0f}"),
    ("late_dup_answered_at_ingress", "late copies answered `duplicate` by the ingress", "{:.2f}"),
    ("dup_total_cost_vs_fresh", "a late copy's CPU, every process / a fresh event's", "{:.2f}"),
    ("recovery_pending_at_kill", "kill -9 of a worker at the last send: events without effect", "{:.0f}"),
    ("recovery_s", "kill -9 of a worker: s until every effect committed", "{:.1f}"),
    ("spooled_while_healthy", "events sent to the outbox, the broker up throughout", "{:.0f}"),
    ("worker_rss_mib", f"worker peak RSS MiB (concurrency {CONCURRENCY})", "{:.0f}"),
    ("ingress_rss_mib", "ingress peak RSS MiB", "{:.0f}"),
    *broker_blocked.ROWS,
    *slow_handlers.ROWS,
    *archive_cost.ROWS,
    *archive_floor.ROWS_TABLE,
    *tracing_cost.ROWS,
    *ordering.ROWS,
    *contract_floor.ROWS,
    *guarantee_costs.ROWS,
    ("lost", "lost events", "{:.0f}"),
    ("duplicated_effects", "duplicated effects", "{:.0f}"),
]


PEER_ROWS = [  # (label, ours, each peer's figure after its name, format)
    ("events/s end to end (20,000 unique)", "e2e_events_per_s", "e2e_events_per_s", "{:,.0f}"),
    (f"p99 ms at {LATENCY_RATE:,} req/s offered", "ingress_p99_ms", "p99_ms", "{:.1f}"),
    ("CPU ms per event, every process", "total_cpu_ms_per_event", "total_cpu_ms_per_event", "{:.2f}"),
    ("lost after kill -9 of a worker", "recovery_lost", "lost_after_kill", "{:.0f}"),
    ("duplicated after kill -9 of a worker", "recovery_duplicated", "duplicated_after_kill", "{:.0f}"),
    ("lost after a 2.5 s SIGSTOP of a worker", "ours_lost_after_pause", "lost_after_pause", "{:.0f}"),
    ("duplicated after the SIGSTOP", "ours_duplicated_after_pause", "duplicated_after_pause", "{:.0f}"),
    ("calls repeated after the SIGSTOP", "ours_calls_repeated_after_pause", "calls_repeated_after_pause", "{:.0f}"),
]


def print_peers(figures: dict) -> None:
    kinds = [kind for kind in peers.KINDS if f"{kind}_lost_after_pause" in figures]
    names = "".join(f" {peers.NAMES[kind]:>10} |" for kind in kinds)
    print(f"\n| {'side by side':<40} | {'ours':>10} |{names}\n| {'-' * 40} |{' ---------- |' * (len(kinds) + 1)}")
    for label, ours, theirs, fmt in PEER_ROWS:
        cells = "".join(f" {fmt.format(figures.get(f'{kind}_{theirs}', float('nan'))):>10} |" for kind in kinds)
        print(f"| {label:<40} | {fmt.format(figures.get(ours, float('nan'))):>10} |{cells}")
    for kind in (kind for kind in kinds if f"e2e_vs_{kind}" in figures):
        print(f"e2e_vs_{kind}: {figures[f'e2e_vs_{kind}']:.2f}, cpu_vs_{kind}: {figures[f'cpu_vs_{kind}']:.2f}")


async def pause_phase_alone() -> int:
    """`--phase pause`: ours and each peer under a 2.5 s SIGSTOP of a worker (tests/bench/faults.py)."""
    figures: dict[str, float] = {"nproc": os.cpu_count()}
    await peers.measure(figures, pause_only=True)
    return report(figures)


async def slow_phases_alone() -> int:
    figures: dict[str, float] = {"nproc": os.cpu_count()}
    await slow_handlers.measure(figures)
    return report(figures)


async def archive_phase_alone() -> int:
    figures: dict[str, float] = {"nproc": os.cpu_count()}
    await archive_cost.measure(figures)
    await archive_floor.measure(figures)
    return report(figures)


async def tracing_phase_alone() -> int:
    figures: dict[str, float] = {"nproc": os.cpu_count()}
    await tracing_cost.measure(figures)
    return report(figures)


async def ordering_phase_alone() -> int:
    figures: dict[str, float] = {"nproc": os.cpu_count()}
    await ordering.measure(figures)
    return report(figures)


def report(figures: dict) -> int:
    print(
        f"\nwebhook-ingest bench — {figures['nproc']} cores, {INGRESS_PROCESSES} ingress processes, "
        f"{WORKERS} workers × concurrency {CONCURRENCY}\n"
    )
    print(f"| {'what':<52} | {'figure':>10} |\n| {'-' * 52} | {'-' * 10} |")
    for key, label, fmt in ROWS:
        if key in figures:
            print(f"| {label:<52} | {fmt.format(figures[key]):>10} |")
    if any(f"{kind}_lost_after_pause" in figures for kind in peers.KINDS):
        print_peers(figures)
    failed = figures["lost"] or figures["duplicated_effects"]
    print("\nFAIL: lost or duplicated effects" if failed else "\nOK: every event's effect exactly once")
    print(json.dumps({key: round(value, 3) for key, value in figures.items()}))
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    parser = argparse.ArgumentParser(prog="python -m tests.bench")
    parser.add_argument(
        "--phase",
        choices=[
            "all",
            "steady",
            "broker-blocked",
            "slow",
            "archive",
            "archive_search",
            "archive_floor",
            "tracing",
            "ingress",
            "ordering",
            "contract_floor",
            "guarantee_costs",
            "partitions",
            "pause",
        ],
        default="all",
        help="every phase (the default), every phase but the broker-blocked one, "
        "or the broker-blocked, slow-handler, archive-cost or tracing-cost phases alone "
        "(tracing: only alone; ingress: ingress_cpu_vs_floor alone; archive_search: searching 1,000,000 "
        "archived events, only alone; archive_floor: what Postgres spends to keep an event, the "
        "pipeline's statements aside; ordering: ordering keys against the same sources unordered, only alone; "
        "contract_floor: ours end to end and the least code keeping our contract, e2e_vs_contract_floor and "
        "cpu_vs_contract_floor; guarantee_costs: that floor with each guarantee added, only alone; "
        "pause: ours, Celery and Dramatiq under a 2.5 s SIGSTOP of a worker, only alone)",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="with all, steady or contract_floor: also the Celery and Dramatiq stacks of tests/bench/peers, "
        "side by side (not in make test)",
    )
    parser.add_argument(
        "--queues",
        default="1,2,4",
        help="partitions: the counts of quorum queues to measure (tests/bench/queue_partitions.py)",
    )
    arguments = parser.parse_args()
    phase = arguments.phase
    if phase == "partitions":
        from tests.bench import queue_partitions

        sys.exit(queue_partitions.main([int(count) for count in arguments.queues.split(",")]))
    alone = {
        "broker-blocked": broker_blocked.main,
        "slow": slow_phases_alone,
        "archive": archive_phase_alone,
        "archive_search": archive_search.main,
        "archive_floor": archive_floor.main,
        "tracing": tracing_phase_alone,
        "ingress": ingress_floor.main,
        "ordering": ordering_phase_alone,
        "contract_floor": lambda: contract_floor_alone(arguments.peers),
        "guarantee_costs": guarantee_costs_alone,
        "pause": pause_phase_alone,
    }
    sys.exit(
        asyncio.run(alone[phase]() if phase in alone else main(with_outage=phase == "all", with_peers=arguments.peers))
    )
