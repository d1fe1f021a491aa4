"""`python -m tests.bench --phase ingress`: `ingress_cpu_vs_floor` alone
(issue 24, item 3), about a minute: the raw broker's confirmed publishes
(the client's CPU per publish), the bare aiohttp server, then the ingress
processes `run` starts under the ingress throughput phase's load, ROUNDS
times (BENCH_INGRESS_ROUNDS, default 3), no workers. What one change to the
ingress's request path does to its CPU per request, without the whole bench."""

import os
import statistics
import time

import aio_pika

from tests.bench import http_floor, httpload, raw_broker
from tests.bench.cpu import cpu_seconds
from tests.bench.deployment import INGRESS_PROCESSES, SECRET, SOURCE, Deployment

PUBLISHES = 15_000
SECONDS = 12
ROUNDS = int(os.environ.get("BENCH_INGRESS_ROUNDS", "3"))


async def main() -> int:
    figures: dict[str, float] = {}
    async with Deployment() as deployment:
        with httpload.gc_paused():
            figures["raw_publish_cpu_ms_client"] = await _publish_cpu_ms(deployment)
        figures.update(await http_floor.measure(SOURCE, SECRET))
        await deployment.start_ingress()
        await httpload.closed_loop(deployment.ingress_port, httpload.signed_requests(SOURCE, SECRET, "warm_", 2_000))
        rounds = [await _ingress_round(deployment, f"load{n}_") for n in range(ROUNDS)]
    figures["ingress_cpu_ms_per_request"] = statistics.median(cpu for cpu, _ in rounds)
    figures["ingress_rps"] = statistics.median(rps for _, rps in rounds)
    figures["ingress_cpu_vs_floor"] = figures["ingress_cpu_ms_per_request"] / (
        figures["http_floor_cpu_ms"] + figures["raw_publish_cpu_ms_client"]
    )
    print(
        f"{INGRESS_PROCESSES} ingress processes, {ROUNDS} rounds of {SECONDS} s, 64 connections; load "
        f"{os.getloadavg()[0]:.1f}"
    )
    print("ingress CPU ms per request, each round: " + ", ".join(f"{cpu:.3f}" for cpu, _ in rounds))
    for key, value in figures.items():
        print(f"{key}: {value:.3f}")
    return 0


async def _publish_cpu_ms(deployment: Deployment) -> float:
    connection = await aio_pika.connect(deployment.amqp_url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        name = f"{deployment.namespace}.raw"
        queue = await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})
        try:
            before = time.process_time()
            await raw_broker.publish_many(channel, name, PUBLISHES)
            return 1000 * (time.process_time() - before) / PUBLISHES
        finally:
            await queue.delete(if_unused=False, if_empty=False)


async def _ingress_round(deployment: Deployment, prefix: str) -> tuple[float, float]:
    """(CPU ms per request, requests/s) of one closed-loop round; the queue purged after."""
    requests = httpload.signed_requests(SOURCE, SECRET, prefix, 8_000 * SECONDS)
    before = sum(cpu_seconds(ingress.pid) for ingress in deployment.ingresses)
    with httpload.gc_paused():
        sent, elapsed, statuses = await httpload.closed_loop(deployment.ingress_port, requests, seconds=SECONDS)
    used = sum(cpu_seconds(ingress.pid) for ingress in deployment.ingresses) - before
    if set(statuses) != {200}:
        raise SystemExit(f"FAIL: the ingress answered {statuses}")
    await deployment.purge_events()
    return 1000 * used / sent, sent / elapsed
