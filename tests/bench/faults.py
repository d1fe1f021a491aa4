"""A stack under a worker's fault, the same steps for ours and each peer
(tests/bench/peers/measure.py, issues 24 and 39): events sent at 400/s for
3 s, the fault half-way — `kill -9` of a worker process, or SIGSTOP for
2.5 s then SIGCONT (a GC pause, a CPU-throttled pod) —, the drain waited
for, then counted: lost (answered 200, never written), repeated rows (a
key's rows past its first) and, with a downstream, repeated calls (its
calls for a key past the first).

The pause runs the same realistic handler on every stack: a call to a
downstream answering in 100 ms (`Idempotency-Key`: the event's key), then
a row — ours `tests.bench.handler:call_then_record` through `forward`, the
peers' `call_then_record` (source `calls`)."""

import asyncio
import dataclasses
import os
import signal
import time
from collections.abc import Awaitable, Callable

from tests.bench import httpload
from tests.bench.deployment import SECRET, Deployment, source_entry
from tests.bench.peers.downstream import CALLING_SOURCE
from tests.bench.slow_handlers import Downstream

FAULT_RATE, FAULT_SECONDS = 400, 3
PAUSE_SECONDS, CALL_SECONDS = 2.5, 0.1
STALL_SECONDS = 30.0  # the drain given up once no row has come for this long: the rest is lost
SETTLE_SECONDS = 1.5  # after the drain, for a late repeat to show


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a fault cost: `written` keys of `accepted` have rows, `rows` in
    all; the downstream's `calls` for `called` keys (None: no downstream)."""

    accepted: int
    written: int
    rows: int
    calls: int | None = None
    called: int = 0

    def figures(self, name: str, fault: str) -> dict[str, int]:
        found = {
            f"{name}_lost_after_{fault}": max(0, self.accepted - self.written),
            f"{name}_duplicated_after_{fault}": self.rows - self.written,
        }
        if self.calls is not None:
            found[f"{name}_calls_repeated_after_{fault}"] = self.calls - self.called
        return found


class Rows:
    """A stack's rows of one run: its table's keys starting `{source}:{prefix}`."""

    def __init__(self, fetchval: Callable[..., Awaitable], table: str, source: str, prefix: str) -> None:
        self._fetchval, self._table, self._pattern = fetchval, table, f"{source}:{prefix}%"

    async def written(self) -> int:
        return await self._fetchval(f"SELECT count(DISTINCT key) FROM {self._table} WHERE key LIKE $1", self._pattern)

    async def total(self) -> int:
        return await self._fetchval(f"SELECT count(*) FROM {self._table} WHERE key LIKE $1", self._pattern)


async def under_fault(
    port: int,
    rows: Rows,
    source: str,
    prefix: str,
    fault: Callable[[], Awaitable[None]],
    downstream: tuple[Downstream, str] | None = None,
) -> Outcome:
    """FAULT_RATE events a second for FAULT_SECONDS to `port`, `fault()`
    half-way; the drain waited for; the outcome (the downstream's calls on
    its path, when given)."""
    requests = httpload.signed_requests(source, SECRET, prefix, FAULT_RATE * FAULT_SECONDS)
    sending = asyncio.create_task(httpload.open_loop(port, requests, FAULT_RATE))
    await asyncio.sleep(FAULT_SECONDS / 2)
    await fault()
    _, statuses = await sending
    accepted = statuses.get(200, 0)
    await until_drained(rows, accepted)
    await asyncio.sleep(SETTLE_SECONDS)
    calls, called = downstream[0].runs(downstream[1]) if downstream else (None, 0)
    return Outcome(accepted, await rows.written(), await rows.total(), calls, called)


async def until_drained(rows: Rows, accepted: int) -> None:
    """Until `accepted` keys have their row, or none came for STALL_SECONDS."""
    last, since = -1, time.monotonic()
    while (written := await rows.written()) < accepted:
        if written != last:
            last, since = written, time.monotonic()
        elif time.monotonic() - since > STALL_SECONDS:
            return
        await asyncio.sleep(0.1)


async def pause(pid: int) -> None:
    """SIGSTOP to `pid`, SIGCONT PAUSE_SECONDS later."""
    os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(PAUSE_SECONDS)
    finally:
        os.kill(pid, signal.SIGCONT)


def call_latency(source: str, key: str) -> float:
    return CALL_SECONDS


async def ours_paused(downstream: Downstream, figures: dict) -> None:
    """Ours, a deployment of its own, its first worker process paused; its
    lost and repeated rows count as the bench's `lost` and `duplicated_effects`."""
    url = f"http://127.0.0.1:{downstream.port}/ours"
    sources = source_entry(CALLING_SOURCE, "tests.bench.handler:call_then_record", url=url)
    async with Deployment(sources=sources) as deployment:
        await deployment.start_ingress()
        await deployment.start_workers()
        victim, _ = deployment.workers[0]
        rows = Rows(deployment.fetchval, "bench_effects", CALLING_SOURCE, "pause_")
        outcome = await under_fault(
            deployment.ingress_port, rows, CALLING_SOURCE, "pause_", lambda: pause(victim.pid), (downstream, "ours")
        )
    figures.update(outcome.figures("ours", "pause"))
    figures["lost"] = figures.get("lost", 0) + figures["ours_lost_after_pause"]
    figures["duplicated_effects"] = figures.get("duplicated_effects", 0) + figures["ours_duplicated_after_pause"]
