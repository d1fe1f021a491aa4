"""The broker-blocked phase of `make bench` (alone: `python -m tests.bench
--phase broker-blocked`): 1,000 req/s offered, open loop, while the broker
takes no publish for 10 s, in two shapes —

- blocked: a memory alarm (`rabbitmqctl set_vm_memory_high_watermark`), so
  the broker sends `connection.blocked` and stops reading from every
  connection that publishes;
- stalled: the ingress's TCP path to the broker forwards nothing
  (tests/support/tcpproxy.py), which is what a hung broker looks like.

An alarm blocks every publisher of a node, so this runs on a private
RabbitMQ node (tests/support/rabbit_cluster.py), never the shared broker;
the ingress reaches it through the proxy in both shapes, so they compare.
The workers start only once both shapes are over: on two shared cores they
would take from the ingress the CPU that 1,000 req/s needs (the end-to-end
rate here is ~400 events/s), and what is measured is the ingress. Then
every event answered 2xx must have had its effect once.

The load runs from 3 s before the outage until 3 s after the broker is
back; the outage starts when `rabbitmqctl` has set the alarm (it takes a
second or more on a loaded machine) and lasts 10 s. Figures per shape:
answers other than 2xx, p50, p99 and max latency of the requests sent while
the broker was away (counted from each scheduled send: answered from the
outbox), the outbox backlog when the broker came back and the seconds from
then until the relays had drained it.
"""

import asyncio
import collections
import json
import subprocess
import sys
import time

from tests.bench import httpload
from tests.bench.deployment import SECRET, SOURCE, Deployment
from tests.support.processes import wait_until
from tests.support.rabbit_cluster import RabbitCluster, RabbitNode
from tests.support.tcpproxy import TcpProxy, free_port

RATE = 1_000
BEFORE_SECONDS, AWAY_SECONDS, AFTER_SECONDS = 3, 10, 3
PREBUILT_SECONDS = 45  # requests signed in advance: the run and whatever `rabbitmqctl` takes
BLOCKING_WATERMARK, USUAL_WATERMARK = "0.0000001", "0.4"
PREFIXES = {"blocked": "blk_", "stalled": "stl_"}

ROWS = [  # (key, label, format), as tests/bench/__main__.py's
    *(
        (f"broker_{shape}_{key}", f"broker {shape} {AWAY_SECONDS} s at {RATE:,} req/s: {what}", fmt)
        for shape in PREFIXES
        for key, what, fmt in (
            ("non_2xx", "answers not 2xx while away", "{:.0f}"),
            ("non_2xx_outside", "answers not 2xx before and after", "{:.0f}"),
            ("p99_ms", "p99 ms while away", "{:.0f}"),
            ("max_ms", "slowest answer ms while away", "{:.0f}"),
            ("draining_p99_ms", "p99 ms while the outbox drains", "{:.0f}"),
            ("backlog", "outbox rows when back", "{:,.0f}"),
            ("drain_s", "s to drain the outbox", "{:.1f}"),
        )
    ),
]


async def measure(figures: dict) -> None:
    """Both shapes on one private node; adds to figures' `lost` and `duplicated_effects`."""
    with RabbitCluster(size=1) as cluster:
        node = cluster.nodes[0]
        with ProxyProcess(node.port) as proxy:
            async with Deployment(amqp_url=node.url()) as deployment:
                await deployment.start_ingress(env={"AMQP_URL": proxy.url_for(node.url())})
                await _warm_up(deployment)
                accepted = {}
                for shape, prefix in PREFIXES.items():
                    away, back = _outage(shape, node, proxy)
                    with httpload.gc_paused():
                        accepted[prefix] = await _one_shape(deployment, shape, prefix, away, back, figures)
                await deployment.start_workers()
                for prefix, keys in accepted.items():
                    await _count_outcome(deployment, prefix, keys, figures)


class ProxyProcess:
    """tests/support/tcpproxy.py in a process of its own: in the bench's
    process its thread would share the GIL with the load client, and the
    broker's confirms would wait for the client's loop."""

    def __init__(self, target_port: int):
        self._target_port = target_port
        self.port = free_port()
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"from tests.bench.broker_blocked import serve_proxy; serve_proxy({target_port}, {self.port})",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._command("started")

    def url_for(self, url: str) -> str:
        """`url` (of the target) through the proxy."""
        target = f"127.0.0.1:{self._target_port}"
        assert target in url, (target, url)
        return url.replace(target, f"127.0.0.1:{self.port}")

    def stall(self) -> None:
        self._command("stall")

    def flow(self) -> None:
        self._command("flow")

    def _command(self, line: str) -> None:
        if line != "started":
            self._process.stdin.write(line + "\n")
            self._process.stdin.flush()
        assert self._process.stdout.readline().strip() == "ok", f"proxy: {line}"

    def __enter__(self) -> "ProxyProcess":
        return self

    def __exit__(self, *exc) -> None:
        self._process.stdin.close()
        self._process.wait(timeout=30)


def serve_proxy(target_port: int, port: int) -> None:
    """The proxy process: `stall` and `flow` on stdin, each answered `ok`; ends with stdin."""
    with TcpProxy("127.0.0.1", target_port, listen_port=port) as proxy:
        print("ok", flush=True)
        for line in sys.stdin:
            getattr(proxy, line.strip())()
            print("ok", flush=True)


def _outage(shape: str, node: RabbitNode, proxy: "ProxyProcess"):
    """(make the broker away, bring it back): blocking calls, run in a thread."""
    if shape == "blocked":
        return (
            lambda: node.ctl("set_vm_memory_high_watermark", BLOCKING_WATERMARK),
            lambda: node.ctl("set_vm_memory_high_watermark", USUAL_WATERMARK),
        )
    return proxy.stall, proxy.flow


async def _warm_up(deployment: Deployment) -> None:
    requests = httpload.signed_requests(SOURCE, SECRET, "warm_", 2_000)
    await httpload.closed_loop(deployment.ingress_port, requests)
    await deployment.purge_events()


async def _one_shape(deployment: Deployment, shape: str, prefix: str, away, back, figures: dict) -> set[str]:
    """Offers the load, makes the broker away and back; the keys answered 2xx."""
    requests = httpload.signed_requests(SOURCE, SECRET, prefix, RATE * PREBUILT_SECONDS)
    stop = asyncio.Event()
    load = asyncio.create_task(offer(deployment.ingress_port, requests, RATE, stop))
    await asyncio.sleep(BEFORE_SECONDS)
    going_away = time.perf_counter()
    await asyncio.to_thread(away)
    went_away = time.perf_counter()
    await asyncio.sleep(AWAY_SECONDS)
    backlog = await _outbox_rows(deployment)
    coming_back = time.perf_counter()
    await asyncio.to_thread(back)
    back_at = time.perf_counter()
    await asyncio.sleep(AFTER_SECONDS)
    stop.set()
    await wait_until(lambda: _outbox_empty(deployment), 300, interval=0.05, message="the outbox drained")
    figures[f"broker_{shape}_drain_s"] = time.perf_counter() - back_at
    figures[f"broker_{shape}_backlog"] = backlog
    answers = await load
    if len(answers) == len(requests):
        print(f"WARNING: {shape}: the load ran out of requests before the end")
    figures.update(_answer_figures(shape, answers, (going_away, went_away, coming_back, back_at)))
    figures[f"broker_{shape}_draining_p99_ms"] = _p99_ms(answers, back_at, back_at + figures[f"broker_{shape}_drain_s"])
    if failures := _failures_by_window(answers, going_away, back_at):
        print(f"FAIL: broker {shape}: answers not 2xx {failures}")
    return {f"{SOURCE}:{prefix}{n}" for n, *_, status in answers if 200 <= status < 300}


def _p99_ms(answers: list[tuple[int, float, float, int]], start: float, end: float) -> float:
    """p99 latency of the requests sent from `start` until `end` (NaN: none)."""
    latencies = sorted(latency for _, sent, latency, _ in answers if start <= sent < end)
    return 1000 * latencies[int(len(latencies) * 0.99)] if latencies else float("nan")


def _failures_by_window(answers: list[tuple[int, float, float, int]], start: float, end: float) -> dict:
    """{window: {status: count}} of the answers not 2xx, by when they were sent."""
    windows: dict[str, dict[int, int]] = {}
    for _, sent, _, status in answers:
        if not 200 <= status < 300:
            window = windows.setdefault("before" if sent < start else "away" if sent < end else "after", {})
            window[status] = window.get(status, 0) + 1
    return windows


def _answer_figures(shape: str, answers: list[tuple[int, float, float, int]], times: tuple) -> dict:
    """Answers not 2xx to requests sent from the moment the broker was made
    away until it was back, and outside that; latencies of the requests sent
    while it was surely away (from the alarm set until its removal began)."""
    going_away, went_away, coming_back, back_at = times
    away = sorted(latency for _, sent, latency, _ in answers if went_away <= sent < coming_back)
    failed = [sent for _, sent, _, status in answers if not 200 <= status < 300]
    during = sum(1 for sent in failed if going_away <= sent < back_at)
    return {
        f"broker_{shape}_non_2xx": during,
        f"broker_{shape}_non_2xx_outside": len(failed) - during,
        f"broker_{shape}_p50_ms": 1000 * away[len(away) // 2],
        f"broker_{shape}_p99_ms": 1000 * away[int(len(away) * 0.99)],
        f"broker_{shape}_max_ms": 1000 * away[-1],
    }


async def offer(
    port: int, requests: list[bytes], rate: float, stop: asyncio.Event
) -> list[tuple[int, float, float, int]]:
    """Open loop until `stop`: each request at its scheduled time, on an idle
    keep-alive connection or a new one — never held back by slow answers, as
    providers send. (request's index, scheduled time, latency from it,
    status) per request sent."""
    # The longest idle first: every connection, so every ingress process
    # sharing the port, gets its share (the last returned first sent most
    # of the load to one process, whose bound then answered 503).
    idle = collections.deque(await httpload.connect(port, 64))
    answers: list[tuple[int, float, float, int]] = []

    async def send(n: int, raw: bytes, scheduled: float) -> None:
        connection = idle.popleft() if idle else (await httpload.connect(port, 1))[0]
        status = await connection.request(raw)
        answers.append((n, scheduled, time.perf_counter() - scheduled, status))
        idle.append(connection)

    started = time.perf_counter() + 0.05
    sends = []
    for n, raw in enumerate(requests):
        if stop.is_set():
            break
        scheduled = started + n / rate
        if (delay := scheduled - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        sends.append(asyncio.create_task(send(n, raw, scheduled)))
    await asyncio.gather(*sends)
    for connection in idle:
        connection.close()
    return answers


async def _outbox_rows(deployment: Deployment) -> int:
    return await deployment.fetchval("SELECT count(*) FROM outbox")


async def _outbox_empty(deployment: Deployment) -> bool:
    return await _outbox_rows(deployment) == 0


async def _count_outcome(deployment: Deployment, prefix: str, accepted: set[str], figures: dict) -> None:
    """Waits for the effect of every accepted event, then counts the lost and the doubled."""
    pattern = f"{SOURCE}:{prefix}%"

    async def keys_done() -> set[str]:
        return set(
            await deployment.fetchval(
                "SELECT coalesce(array_agg(DISTINCT key), '{}') FROM bench_effects WHERE key LIKE $1", pattern
            )
        )

    async def all_there() -> bool:
        return accepted <= await keys_done()

    try:
        await wait_until(all_there, 180, interval=0.2, message=f"the effects of {len(accepted)} {prefix} events")
    except AssertionError as exc:
        print(f"FAIL: {exc}")
    done = await keys_done()
    rows = await deployment.fetchval("SELECT count(*) FROM bench_effects WHERE key LIKE $1", pattern)
    figures["lost"] = figures.get("lost", 0) + len(accepted - done)
    figures["duplicated_effects"] = figures.get("duplicated_effects", 0) + rows - len(done)


async def main() -> int:
    """The phase alone: its table, then its JSON line; 1 on an answer not
    2xx, or a lost or doubled effect."""
    figures: dict[str, float] = {}
    await measure(figures)
    print(f"\n| {'what':<62} | {'figure':>8} |\n| {'-' * 62} | {'-' * 8} |")
    for key, label, fmt in [
        *ROWS,
        ("lost", "lost events", "{:.0f}"),
        ("duplicated_effects", "duplicated effects", "{:.0f}"),
    ]:
        print(f"| {label:<62} | {fmt.format(figures[key]):>8} |")
    print(json.dumps({key: round(value, 3) for key, value in figures.items()}))
    non_2xx = sum(figures[f"broker_{shape}_non_2xx{part}"] for shape in PREFIXES for part in ("", "_outside"))
    return 1 if figures["lost"] or figures["duplicated_effects"] or non_2xx else 0
