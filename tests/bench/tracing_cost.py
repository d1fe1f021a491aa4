"""What OpenTelemetry tracing costs (issue 25, item 3): the same events end
to end through one deployment, its processes started without any `OTEL_*`
variable (tracing off) and again with `OTEL_EXPORTER_OTLP_ENDPOINT` set
(tracing on), in turn.

On, the processes export to an OTLP/HTTP receiver in the bench's own
process that reads each request's spans and keeps nothing, so the
figure is what an operator's processes pay — spans made, batched, encoded
and posted — and not a collector's CPU. Each run starts the ingress and
the workers afresh with its variables, warms them up, then sends
RUN_EVENTS unique events as fast as the ingress takes them; the CPU of
the ingress and of the workers is read until SETTLE_SECONDS after the
last ack, so the exporter's last batches (sent every 5 s at most) are
counted. Runs go off, on, on, off (ROUNDS of each), so a drift of the
database over the runs is not charged to either.

Reported: CPU ms per event of the ingress and of the workers, events/s,
each for off and on, their ratios, and the spans received per event
when on (0 off: nothing may be exported, nor made).
"""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from aiohttp import web

from tests.bench import httpload
from tests.bench.cpu import cpu_seconds
from tests.bench.deployment import SECRET, SOURCE, Deployment
from tests.support.exactly_once import until_every_message_handled
from tests.support.tcpproxy import free_port

RUN_EVENTS, ROUNDS, WARM_UP = 10_000, 2, 2_000
SETTLE_SECONDS = 6.0  # the batch span processor sends at least every 5 s
STATES = ("off", "on")
PARTS = ("ingress", "workers")

ROWS = [
    *[
        (
            f"tracing_{state}_events_per_s",
            f"tracing {state}: end to end events/s ({RUN_EVENTS:,} × {ROUNDS})",
            "{:,.0f}",
        )
        for state in STATES
    ],
    *[
        (f"tracing_{state}_cpu_ms_{part}", f"tracing {state}: CPU ms per event, {part}", "{:.3f}")
        for part in PARTS
        for state in STATES
    ],
    *[(f"tracing_cpu_ratio_{part}", f"tracing on / off: CPU per event, {part}", "{:.3f}") for part in PARTS],
    ("tracing_e2e_ratio", "tracing on / off: events/s", "{:.3f}"),
    *[(f"tracing_{state}_spans_per_event", f"tracing {state}: spans exported per event", "{:.2f}") for state in STATES],
]


class SpanSink:
    """An OTLP/HTTP receiver that counts the spans posted to /v1/traces."""

    def __init__(self) -> None:
        self.spans = 0
        self.port = free_port()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def receive(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.spans += _span_count(body)
        return web.Response(body=b"", content_type="application/x-protobuf")

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator["SpanSink"]:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/traces", self.receive)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        try:
            yield self
        finally:
            await runner.cleanup()


def _span_count(body: bytes) -> int:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    export = ExportTraceServiceRequest.FromString(body)
    return sum(len(scope.spans) for resource in export.resource_spans for scope in resource.scope_spans)


async def measure(figures: dict) -> None:
    async with Deployment() as deployment, SpanSink().serving() as sink:
        runs: dict[str, list[tuple[float, dict[str, float], int]]] = {state: [] for state in STATES}
        for round_ in range(ROUNDS):
            for state in STATES if round_ % 2 == 0 else tuple(reversed(STATES)):
                runs[state].append(await one_run(deployment, sink, state, f"r{round_}{state}_"))
        report(runs, figures)
        await count_effects(deployment, figures)


async def one_run(deployment: Deployment, sink: SpanSink, state: str, prefix: str) -> tuple[float, dict, int]:
    """(seconds, CPU seconds by part, spans received) for RUN_EVENTS events through fresh processes."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint, "OTEL_SERVICE_NAME": "bench"} if state == "on" else {}
    await deployment.start_ingress(env)
    await deployment.start_workers(env)
    try:
        handled = await send(deployment, f"warm_{prefix}", WARM_UP, 0)
        await asyncio.sleep(SETTLE_SECONDS)
        spans_before, cpu_before = sink.spans, _cpu(deployment)
        started = time.perf_counter()
        await send(deployment, prefix, RUN_EVENTS, handled)
        elapsed = time.perf_counter() - started
        await asyncio.sleep(SETTLE_SECONDS)
        cpu_after = _cpu(deployment)
        return elapsed, {part: cpu_after[part] - cpu_before[part] for part in PARTS}, sink.spans - spans_before
    finally:
        await deployment.stop_processes()


async def send(deployment: Deployment, prefix: str, count: int, handled: int) -> int:
    """`count` events through the ingress, until every one is acked; the workers' running count."""
    requests = httpload.signed_requests(SOURCE, SECRET, prefix, count)
    with httpload.gc_paused():
        _, _, statuses = await httpload.closed_loop(deployment.ingress_port, requests)
    if set(statuses) != {200}:
        raise SystemExit(f"FAIL: tracing cost: the ingress answered {statuses}")
    handled += count
    await until_every_message_handled([url for _, url in deployment.workers], handled, timeout=300)
    return handled


def _cpu(deployment: Deployment) -> dict[str, float]:
    return {part: sum(cpu_seconds(pid) for pid in pids) for part, pids in deployment.pids().items()}


def report(runs: dict, figures: dict) -> None:
    for state, measured in runs.items():
        events = RUN_EVENTS * len(measured)
        figures[f"tracing_{state}_events_per_s"] = events / sum(elapsed for elapsed, _, _ in measured)
        for part in PARTS:
            figures[f"tracing_{state}_cpu_ms_{part}"] = 1000 * sum(cpu[part] for _, cpu, _ in measured) / events
        figures[f"tracing_{state}_spans_per_event"] = sum(spans for _, _, spans in measured) / events
    for part in PARTS:
        figures[f"tracing_cpu_ratio_{part}"] = (
            figures[f"tracing_on_cpu_ms_{part}"] / figures[f"tracing_off_cpu_ms_{part}"]
        )
    figures["tracing_e2e_ratio"] = figures["tracing_on_events_per_s"] / figures["tracing_off_events_per_s"]


async def count_effects(deployment: Deployment, figures: dict) -> None:
    """Every event of every run once, tracing or not."""
    sent = (WARM_UP + RUN_EVENTS) * ROUNDS * len(STATES)
    distinct = await deployment.fetchval("SELECT count(DISTINCT key) FROM bench_effects")
    rows = await deployment.fetchval("SELECT count(*) FROM bench_effects")
    figures["lost"] = figures.get("lost", 0) + sent - distinct
    figures["duplicated_effects"] = figures.get("duplicated_effects", 0) + rows - distinct
