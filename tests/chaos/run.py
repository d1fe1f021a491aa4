"""One fault run, end to end: plan from the seed, traffic and faults
together, a bounded drain, the checks, the report.

Two targets: `run_local` builds its own deployment on this machine and
injects faults into it; `run_staging` only sends signed traffic to an
operator's ingress (`--url`) and reads that deployment's tables and queues.
"""

import asyncio
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from tests.chaos import ordering, replays, reruns
from tests.chaos.applied import FullDeployment
from tests.chaos.checks import (
    Observed,
    Verdict,
    connect,
    judge,
    judge_runs,
    observe,
    prune_times,
    resolved,
    run_keys,
)
from tests.chaos.deployment import (
    PRUNE_WINDOW,
    SECRET,
    SETTLE_SECONDS,
    SOURCE,
    known_queues,
    namespace_queues,
)
from tests.chaos.downstream import Downstream, serving
from tests.chaos.plan import Plan, make_plan
from tests.chaos.queues import held_by_rabbitmqctl, peek, ready_by_passive_declare
from tests.chaos.report import render
from tests.chaos.traffic import Sent, send_all
from webhook_ingest.cli import layout

POLL_SECONDS = 2.0


@dataclass
class Options:
    seed: int
    events: int = 2000
    duration: float = 60.0  # seconds of traffic, and of faults beside it
    drain_timeout: float = 180.0  # the most the drain may take after the traffic
    stall_seconds: float = 30.0  # the drain gives up once nothing moved for this long
    concurrency: int = layout.CONCURRENCY  # the `run` defaults
    lock_ttl: float = 3.0
    work_ms: int = 100
    faults: bool = True
    keep_database: bool = False  # a local run's database stays, to be read after a failure
    routes: tuple[str, ...] = ()  # a local run's source has these routes (each event runs once per route)
    replays: bool = True  # an event replay, a dead-letter bulk replay and events failing until one
    # "keys": versions of objects to a source ordered by object, check_order (tests/chaos/ordering.py);
    # "off": the same plan and checks, the source not ordered (a baseline: check_order should find faults)
    ordering: str = ""


@dataclass
class Result:
    report: str
    verdict: Verdict


async def run_local(
    options: Options, namespace: str | None = None, database_url: str | None = None, log_dir: Path | None = None
) -> Result:
    ordered = None
    if options.ordering:
        ordered = ordering.make_ordered_plan(
            options.seed, options.events, options.duration, faults=options.faults, lock_ttl=options.lock_ttl
        )
        plan = ordered.plan
    else:
        plan = make_plan(
            options.seed,
            options.events,
            options.duration,
            faults=options.faults,
            lock_ttl=options.lock_ttl,
            replays=options.replays,
        )
    async with serving() as downstream:
        return await _run_local(options, plan, downstream, namespace, database_url, log_dir, ordered)


async def _run_local(
    options: Options,
    plan: Plan,
    downstream: Downstream,
    namespace: str | None,
    database_url: str | None,
    log_dir: Path | None,
    ordered: ordering.OrderedPlan | None = None,
) -> Result:
    deployment = FullDeployment(
        namespace,
        database_url,
        concurrency=options.concurrency,
        lock_ttl=options.lock_ttl,
        work_ms=options.work_ms,
        log_dir=log_dir,
        keep_database=options.keep_database,
        routes=options.routes,
        downstream_url=downstream.url,
        ordering=options.ordering,
    )
    async with deployment:
        faults = asyncio.create_task(deployment.run_faults(plan.faults))
        if ordered is not None:
            sent, timings = await ordering.send_groups(deployment.base_url, SOURCE, SECRET, ordered)
        else:
            sent = await send_all(deployment.base_url, SOURCE, SECRET, plan.requests)
        applied = await faults
        deployment.all_restored()

        async def held() -> dict[str, int] | None:
            return await held_by_rabbitmqctl(deployment.namespace)

        drained = await drain(deployment.database_url, sent, held, options)
        await deployment.stop_workers()
        await archive_settled(deployment.database_url)
        names = await namespace_queues(deployment.amqp_url, deployment.namespace, events_only=True) or known_queues(
            deployment.namespace
        )
        leftover = await ready_by_passive_declare(deployment.amqp_url, names)
        left = {queue: await peek(deployment.amqp_url, queue) for queue, count in leftover.items() if count}
        seen = await observe(deployment.database_url)
        seen.workers = deployment.pids
        for fault in deployment.applied:
            if fault.action == "pause":
                seen.stopped[fault.pid].append((fault.started, fault.ended))
        verdict = judge(plan.events, sent, seen, deployment.prunes, leftover, options.routes, left)
        more = await judge_calls_and_replays(plan, sent, seen, deployment, downstream, options.routes, verdict)
        more.append(f"prunes     {prune_times(deployment.prunes)} (each start–end, --older-than {PRUNE_WINDOW})")
        if ordered is not None:
            effects, blocked = await ordering.observe(deployment.database_url)
            versions = ordering.accepted_versions(ordered, sent, timings)
            more += ordering.check_order(versions, effects, downstream.calls, seen.stopped_at, blocked, verdict).lines()
    (deployment.log_dir / "faults.txt").write_text("".join(f"{line}\n" for line in applied))
    kept = f"; database kept: {deployment.database_url}" if deployment.keep_database else ""
    routed = f", {len(options.routes)} routes" if options.routes else ""
    routed += {"keys": ", ordered by object", "off": ", ordering off (baseline)"}.get(options.ordering, "")
    report = render(
        plan,
        sent,
        verdict,
        f"a local deployment (3 workers, 1 degraded{routed})",
        drained,
        f"{deployment.log_dir}{kept}",
        more,
    )
    return Result(report, verdict)


async def judge_calls_and_replays(
    plan: Plan,
    sent: Sent,
    seen: Observed,
    deployment: FullDeployment,
    downstream: Downstream,
    routes: tuple[str, ...],
    verdict: Verdict,
) -> list[str]:
    """Issue 35's checks beside `judge`'s: one successful external call per
    key unless a fault explains another (tests/chaos/reruns.py), the
    replays' promises (tests/chaos/replays.py); returns the report's lines
    on re-runs and replays."""
    runs = await reruns.observe_runs(deployment.database_url)
    replays_seen = await replays.observe(deployment.database_url, deployment.issued, SOURCE)
    successes, tally = downstream.successes(), reruns.Reruns()
    logs = {process.pid: process.log_path for process in deployment.fleet.processes if process.pid in seen.workers}
    reruns.judge_calls(
        successes,
        runs,
        deployment.applied,
        deployment.prunes,
        seen.workers,
        verdict,
        tally,
        reruns.leases_given_up(logs),
        deployment.lock_ttl,
    )
    reruns.count_reruns(runs, deployment.applied, deployment.prunes, seen.replayed, tally)
    for key in seen.effects:
        if not successes.get(key):
            verdict.violate("effect without its call", f"{key}: an effect, and no successful call downstream")
    for event in plan.events:
        key = sent.accepted.get(event.event_id)
        if key is not None and event.fail == "until_replayed":
            for each in run_keys(key, routes):
                replays.judge_until_replayed(each, replays_seen, deployment.issued, verdict)

    def intervals(key: str) -> None:
        judge_runs(key, seen, sorted(seen.effects.get(key, []))[:1], deployment.prunes, verdict)

    replayed = replays.judge_event_replays(
        plan.events, sent, seen, replays_seen, deployment.issued, routes, verdict, intervals, deployment.prunes
    )
    return reruns.report_lines(tally, replayed) + replays.report_lines(deployment.issued, replays_seen)


async def run_staging(
    options: Options, url: str, source: str, secret: str, database_url: str, amqp_url: str | None, namespace: str | None
) -> Result:
    """Traffic to `url` only; no fault is injected (cause your own while it runs)."""
    prefix = f"chaos-{options.seed}-{uuid.uuid4().hex[:6]}-"
    plan = make_plan(options.seed, options.events, options.duration, faults=False, id_prefix=prefix)
    sent = await send_all(url, source, secret, plan.requests)
    queue_names = known_queues(namespace) if amqp_url and namespace else []

    async def held() -> dict[str, int] | None:
        return await ready_by_passive_declare(amqp_url, queue_names) if queue_names else {}

    pattern = f"{source}:{prefix}%"
    drained = await drain(database_url, sent, held, options, pattern)
    leftover = await ready_by_passive_declare(amqp_url, queue_names) if queue_names else {}
    verdict = judge(plan.events, sent, await observe(database_url, pattern), [], leftover)
    return Result(render(plan, sent, verdict, url, drained, ""), verdict)


async def drain(
    database_url: str,
    sent: Sent,
    held: Callable[[], Awaitable[dict[str, int] | None]],
    options: Options,
    key_pattern: str = "%",
) -> str:
    """Waits until every accepted key is resolved and the queues hold nothing
    (twice in a row), or nothing moved for `stall_seconds`, or the timeout;
    giving up, it names the queues that still held messages."""
    started = last_change = time.monotonic()
    last_state, calm, keys = None, 0, len(set(sent.accepted.values())) * max(len(options.routes), 1)
    while True:
        done, by_queue = resolved(sent, await observe(database_url, key_pattern), options.routes), await held()
        in_queues = None if by_queue is None else sum(by_queue.values())
        now = time.monotonic()
        calm = calm + 1 if done == keys and not in_queues else 0
        if calm >= 2:
            return f"settled {now - started:.0f}s after the traffic ({keys} keys resolved, queues empty)"
        if (done, in_queues) != last_state:
            last_state, last_change = (done, in_queues), now
        if now - last_change > options.stall_seconds or now - started > options.drain_timeout:
            where = ", ".join(f"{queue} {count}" for queue, count in sorted((by_queue or {}).items()) if count)
            return (
                f"gave up after {now - started:.0f}s: {done}/{keys} keys resolved, "
                f"{in_queues} message(s) still held{f' ({where})' if where else ''}, "
                f"no change for {now - last_change:.0f}s"
            )
        await asyncio.sleep(POLL_SECONDS)


# what the upkeep has yet to settle: a lost outcome's row, or a note written of an arrival before its run
UNSETTLED = """
SELECT count(*) FROM event_archive a
WHERE a.status IN ('queued', 'retrying')
   OR (a.status IN ('duplicate', 'conflict') AND EXISTS (
       SELECT FROM processed_events p WHERE p.source = a.source AND p.event_id = a.event_id
                                        AND p.arrival = a.arrival AND p.payload_sha256 = a.payload_sha256
                                        AND (p.key = a.key OR starts_with(p.key, a.key || '#'))))"""


async def archive_settled(database_url: str) -> None:
    """Until no archived arrival is left `queued` or `retrying`, nor
    `duplicate` or `conflict` while a completion names it, for the sweep's
    grace and a few of its rounds at most: with the workers stopped, such
    a row is a killed worker's lost outcome, which the ingress's upkeep
    settles (docs/design.md, "The settling sweep"); one still unsettled then is
    judged as it is."""
    deadline = time.monotonic() + SETTLE_SECONDS + 5 * POLL_SECONDS
    while time.monotonic() < deadline:
        connection = await connect(database_url)
        try:
            left = await connection.fetchval(UNSETTLED)
        finally:
            await connection.close()
        if not left:
            return
        await asyncio.sleep(POLL_SECONDS)


def staging_environment() -> dict[str, str | None]:
    return {
        "secret": os.environ.get("CHAOS_SECRET"),
        "database_url": os.environ.get("DATABASE_URL"),
        "amqp_url": os.environ.get("AMQP_URL"),
        "namespace": os.environ.get("WEBHOOK_INGEST_NAMESPACE"),
    }
