"""Never concurrently, never after completion (docs/reference.md §7.2), with
real worker processes and real services: at most one worker runs a key's
handler at a time, and a holder that lost the key's lease stops.

Covers a holder whose Postgres session is cut mid-handler (also for longer
than its lease), whose Postgres is black-holed or stalls (its handler is
cancelled by the lease's timer alone), and a holder cut from Postgres before
its attempt record, whose copy must not run the attempt again.

Handlers come from tests.support.handlers. A test marked xfail(strict) is a
finding not fixed yet: it fails on purpose, and the suite says so once it
passes. Paused holders, busy loops and Redis: test_paused_worker.py,
test_busy_black_hole.py, test_three_redis.py."""

import asyncio
import itertools

import asyncpg
import pytest

from tests.support.events import make_event, publish_events
from tests.support.exactly_once import recorded_runs, until_completed, write_sources
from tests.support.outcomes import queue_empty as _queue_empty
from tests.support.outcomes import settled_quietly as _settled_quietly
from tests.support.processes import count_rows, wait_for_output, wait_until
from tests.support.tcpproxy import TcpProxy

pytestmark = pytest.mark.usefixtures("effects_tables")
HANDLERS = "tests.support.handlers"
ADVERSARY = HANDLERS  # what the tests found in review rounds call it (they had a handlers module of their own)


def _overlapping(runs) -> list[tuple]:
    """Pairs of runs of one key whose intervals intersect."""
    return [
        (a["pid"], b["pid"])
        for i, a in enumerate(runs)
        for b in runs[i + 1 :]
        if a["key"] == b["key"] and a["started"] < b["ended"] and b["started"] < a["ended"]
    ]


async def _first_run_pid(database_url: str) -> int:
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetchval("SELECT pid FROM runs_started ORDER BY ctid LIMIT 1")
    finally:
        await connection.close()


async def _runs_with_the_holders_session_cut(
    settings, fleet, tmp_path, handler_seconds: float, black_hole: bool = False
) -> list:
    """Two workers, each with its own Postgres proxy; the one that takes the
    event first is cut from Postgres as its handler starts (`black_hole`:
    its proxy stalls instead, closing nothing, until the holder settled its
    message); a copy follows."""
    sources = write_sources(
        tmp_path / "s.toml", f"{HANDLERS}:long_external", database_url=settings.database_url, seconds=handler_seconds
    )
    event = make_event("acme", "evt_session_lost")
    with TcpProxy("127.0.0.1", 5432) as first, TcpProxy("127.0.0.1", 5432) as second:
        proxies = {}
        for proxy in (first, second):  # each worker reaches Postgres through its own proxy
            worker = fleet.worker(
                "--concurrency",
                "1",
                env={"WEBHOOK_INGEST_SOURCES": sources, "DATABASE_URL": proxy.url_for(settings.database_url)},
            )
            proxies[worker.pid] = (worker, proxy)
        for worker in fleet.processes:
            await wait_for_output(worker, "worker_consuming")
        await publish_events(settings.amqp_url, settings.namespace, [event])
        await wait_until(
            lambda: count_rows(settings.database_url, "runs_started"), 30, interval=0.05, message="the holder's run"
        )
        holder, holder_proxy = proxies[await _first_run_pid(settings.database_url)]
        if black_hole:
            holder_proxy.stall()  # its handler runs on
        else:
            holder_proxy.cut()  # its session ends; its handler runs on
        await publish_events(settings.amqp_url, settings.namespace, [event])  # the provider's retry: the other worker
        await wait_until(lambda: count_rows(settings.database_url, "runs"), 30, message="the holder's run ends")
        if black_hole:  # the holder lets go of its message, not waiting on the black hole
            await wait_for_output(holder, '"outcome":"deferred"')
        holder_proxy.flow()
        holder_proxy.restore()
        await until_completed(settings.database_url, 1, timeout=60)
        await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
        await asyncio.sleep(2)  # a deferred copy comes back after 1 s
    return await recorded_runs(settings.database_url)


async def _fetchval(database_url: str, sql: str, *args):
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetchval(sql, *args)
    finally:
        await connection.close()


async def _fetch(database_url: str, sql: str, *args):
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetch(sql, *args)
    finally:
        await connection.close()


async def test_a_holder_that_loses_its_postgres_session_mid_handler_has_no_run_beside_it(settings, fleet, tmp_path):
    """Worker A (Postgres through a proxy, Redis fine) runs a 4 s external
    effect; its Postgres connection is cut as it starts (a failover, a network
    cut): the server ends A's session and with it the key's advisory lock,
    while A's handler — which does not touch ctx.db until its end — keeps
    running, and A keeps its Redis lock extended. A copy of the event
    reaches worker B: no two runs of the key may overlap (§7.2)."""
    runs = await _runs_with_the_holders_session_cut(settings, fleet, tmp_path, handler_seconds=4)
    assert _overlapping(runs) == [], runs


async def test_a_holder_cut_from_postgres_during_a_handler_longer_than_its_lease_has_no_run_beside_it(
    settings, fleet, tmp_path
):
    """Finding 1 again with a 9 s external effect (a slow receiver; forward
    waits up to 10 s): the holder's lease runs out while its handler still
    calls the outside world. No two runs of the key may overlap (§7.2): the
    holder, unable to renew its lease, cancels its handler first."""
    runs = await _runs_with_the_holders_session_cut(settings, fleet, tmp_path, handler_seconds=9)
    assert _overlapping(runs) == [], runs


async def test_a_holder_whose_postgres_is_black_holed_lets_go_of_the_key(settings, fleet, tmp_path):
    """Adversary note: the holder's Postgres stops answering mid-handler — a
    black hole, nothing closed (a partition; here its proxy stalls). Its
    lease runs out and its handler is cancelled (finding 1b); a rollback
    sent into the black hole would then wait as long as it lasts (hours,
    for a partition), the worker's slot and its message with it. The
    holder closes that session instead and settles its message while the
    black hole lasts; afterwards the event completes once, and no two runs
    overlap (§7.2)."""
    runs = await _runs_with_the_holders_session_cut(settings, fleet, tmp_path, handler_seconds=9, black_hole=True)
    assert _overlapping(runs) == [], runs


async def test_a_holder_whose_postgres_path_stalls_cancels_its_handler_and_has_no_run_beside_it(
    settings, fleet, tmp_path
):
    """716d86b against a black hole rather than a cut: the holder's Postgres
    path stalls (connections open, nothing answered), so its renewals get no
    answer at all — neither success nor failure. The timer alone must
    cancel the 5 s external effect before the lease (3 s) can run out, and
    the copy on the other worker must not run beside it, neither while the
    path stalls nor once it flows again (whether the copy runs during the
    stall — the holder's session gone — or after it is not asserted)."""
    sources = write_sources(
        tmp_path / "s.toml",
        "tests.support.handlers:long_external",
        database_url=settings.database_url,
        seconds=5,
    )
    event = make_event("acme", "evt_black_hole")
    with TcpProxy("127.0.0.1", 5432) as first, TcpProxy("127.0.0.1", 5432) as second:
        proxies = {}
        for proxy in (first, second):
            worker = fleet.worker(
                "--concurrency",
                "1",
                env={"WEBHOOK_INGEST_SOURCES": sources, "DATABASE_URL": proxy.url_for(settings.database_url)},
            )
            proxies[worker.pid] = proxy
        for worker in fleet.processes:
            await wait_for_output(worker, "worker_consuming")
        await publish_events(settings.amqp_url, settings.namespace, [event])
        await wait_until(
            lambda: count_rows(settings.database_url, "runs_started"), 30, interval=0.05, message="the holder's run"
        )
        holder_pid = await _fetchval(settings.database_url, "SELECT pid FROM runs_started LIMIT 1")
        proxies[holder_pid].stall()
        await publish_events(settings.amqp_url, settings.namespace, [event])  # the provider's retry
        await wait_until(
            lambda: count_rows(settings.database_url, "runs"), 30, interval=0.05, message="the holder's run ends"
        )
        holder_run = await _fetchval(settings.database_url, "SELECT ended - started FROM runs LIMIT 1")
        await asyncio.sleep(4)  # the lease ran out long ago; the copy keeps trying
        proxies[holder_pid].flow()
        await wait_until(lambda: count_rows(settings.database_url, "processed_events"), 60, message="a completion")
        await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
        await asyncio.sleep(2)  # a deferred copy comes back after 1 s
    runs = await _fetch(settings.database_url, "SELECT key, pid, started, ended FROM runs ORDER BY started")

    assert holder_run < 3, f"the holder's effect ran {holder_run:.1f} s: not cancelled before its lease ran out"
    assert [(a["pid"], b["pid"]) for a, b in itertools.pairwise(runs) if b["started"] < a["ended"]] == [], runs
    assert await count_rows(settings.database_url, "effects") == 1


@pytest.mark.xfail(
    strict=True,
    reason=(
        "finding B6: a worker cut from Postgres after its failed attempt's retry was confirmed cannot record the "
        "attempt handed on nor keep its lease; a copy of the attempt on another worker then runs it again and "
        "starts a second chain (one fault: the broker confirms at once)"
    ),
)
async def test_a_holder_cut_from_postgres_before_its_record_does_not_let_a_copy_run_its_attempt_again(
    settings, fleet, tmp_path
):
    """Attempt 1 of an event fails on worker A; its retry is confirmed by a
    healthy broker at once, but A's Postgres path is cut (a partition, a
    failover) just before, so A can neither write the attempt record nor
    renew the key's lease: the record waits for Postgres (retried for ever,
    7587f9e), the lease runs out on the server. The provider sends the event
    again (it does, routinely), to worker B, which reaches Postgres: it finds
    the lease free and no record, and runs attempt 1 again — a second retry
    chain for one failed attempt. §8: attempted max_attempts (2) times; the
    design names a killed worker and "a holder that cannot keep its lease
    while it waits for the broker's confirm (Postgres unreachable from it,
    too): two faults at once" — here the broker answered, one fault is enough."""
    from tests.support.tcpproxy import TcpProxy

    sources = write_sources(
        tmp_path / "s.toml", f"{ADVERSARY}:failing_external", database_url=settings.database_url, seconds=2
    )
    text = (tmp_path / "s.toml").read_text()  # a retry delay longer than the lease: the copy comes first
    (tmp_path / "s.toml").write_text(
        text.replace("max_attempts = 3\nretry_delays = [0.5]", "max_attempts = 2\nretry_delays = [8]")
    )
    event = make_event("acme", "evt_cut_before_record")
    with TcpProxy("127.0.0.1", 5432) as postgres:
        cut_off = fleet.worker(
            "--concurrency",
            "1",
            env={"WEBHOOK_INGEST_SOURCES": sources, "DATABASE_URL": postgres.url_for(settings.database_url)},
        )
        await wait_for_output(cut_off, "worker_consuming")
        await publish_events(settings.amqp_url, settings.namespace, [event])
        await wait_until(
            lambda: count_rows(settings.database_url, "runs"), 30, interval=0.05, message="attempt 1 running"
        )
        await asyncio.sleep(1.2)
        postgres.cut()  # the handler fails 0.8 s later, before the lease counts as lost: a failed attempt
        fleet.worker("--concurrency", "2", env={"WEBHOOK_INGEST_SOURCES": sources})
        await wait_for_output(cut_off, "attempt_record_waiting_for_postgres", timeout=20)
        await publish_events(settings.amqp_url, settings.namespace, [event])  # the provider's copy
        await asyncio.sleep(6)  # the lease has run out on the server
        postgres.restore()
        await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 60, message="the dead letter")
        await _settled_quietly(settings)
    attempts = sorted(run["started"] for run in await recorded_runs(settings.database_url))
    assert attempts == [1.0, 2.0], attempts
