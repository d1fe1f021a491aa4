"""A black hole is no slow loop (issue 35, item 1).

A worker's keeper counts an unanswered confirmation as a black hole only
if its loop was not slow meanwhile (`workers.claim.lease`). A worker whose own
handlers keep its loop late at every step — calls whose answers stream in
and are worked on without Postgres — never looks idle when its path to
Postgres drops every packet: its leases run out in Postgres while its
handlers go on, and another worker takes their keys and calls beside them.

Found (adversary of the slow-loop rule, merge 97b8065): 8 calls of 12 s,
each working 8 ms every 20 ms, keep the holder's loop late 39-46 % of every
half second; black-holed once they had all started, the holder's calls all
ran their full 12 s, none cancelled, and the other worker called 2 of the
keys again about 4 s after they started, both calls at once for 8 s (two runs
alike). Nothing bounds it but the handler: the keeper extends a sixth of
the TTL at a time while the loop stays slow, the TCP keepalives reach
only a session that is sent something, and this handler sends Postgres
nothing until its end. Before the merge this passes (the calls cancelled
at the limit, a sixth of the TTL before the lease ran out); with e25c75c
alone (a TTL after asking) the calls overlapped 0.9 s."""

import asyncio
import collections

import pytest

from tests.support.events import make_event, publish_events
from tests.support.exactly_once import write_sources
from tests.support.processes import wait_for_output, wait_until
from tests.support.tcpproxy import TcpProxy

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("effects_tables")]

EVENTS = 8
HANDLER = "tests.support.handlers:busy_external"
CALL_SECONDS = 12  # each call: four TTLs (3 s), long enough for another worker to take its key
BUSY_MS = 8  # of the loop every 20 ms, each call: with 8 in flight the loop is late at every step


def _calls(path) -> list[tuple[str, int, float, float]]:
    lines = [line.split() for line in path.read_text().splitlines() if not line.startswith("start ")]
    return [(key, int(pid), float(started), float(ended)) for key, pid, started, ended in lines]


def _overlapping(calls) -> list[tuple]:
    by_key = collections.defaultdict(list)
    for call in calls:
        by_key[call[0]].append(call)
    return [
        (a, b)
        for runs in by_key.values()
        for i, a in enumerate(runs)
        for b in runs[i + 1 :]
        if a[1] != b[1] and a[2] < b[3] and b[2] < a[3]
    ]


@pytest.mark.xfail(strict=True, reason="a loop kept slow by its handlers is never a black hole (issue 35)")
async def test_a_black_hole_under_a_loop_its_handlers_keep_slow_stops_them(settings, fleet, tmp_path):
    intervals = tmp_path / "intervals"
    intervals.write_text("")
    sources = write_sources(
        tmp_path / "s.toml", HANDLER, seconds=CALL_SECONDS, busy_ms=BUSY_MS, intervals=str(intervals)
    )
    events = [make_event("acme", f"evt_{n}") for n in range(EVENTS)]
    with TcpProxy("127.0.0.1", 5432) as first, TcpProxy("127.0.0.1", 5432) as second:
        holder = fleet.worker(
            env={"WEBHOOK_INGEST_SOURCES": sources, "DATABASE_URL": first.url_for(settings.database_url)}
        )
        await wait_for_output(holder, "worker_consuming")
        await publish_events(settings.amqp_url, settings.namespace, events)

        async def all_started() -> bool:
            return intervals.read_text().count("start ") == EVENTS

        await wait_until(all_started, 30, interval=0.05, message="the holder's calls")
        first.stall()  # a black hole: the holder's packets to Postgres are dropped, nothing closes
        other = fleet.worker(
            env={"WEBHOOK_INGEST_SOURCES": sources, "DATABASE_URL": second.url_for(settings.database_url)}
        )
        await wait_for_output(other, "worker_consuming")
        await publish_events(settings.amqp_url, settings.namespace, events)  # the provider's retries
        await asyncio.sleep(CALL_SECONDS + 3)  # every call of the holder ended, or was cancelled
        first.flow()
    assert _overlapping(_calls(intervals)) == []
