"""On-call sees the workers (issue 35, requirement 7), with real processes:
each worker reports itself (its row on the admin API and the console's
overview, its outcomes counted per minute); one stopped with a real SIGSTOP
is shown silent after its heartbeat and the ingress's
`webhook_workers_silent` says so; SIGCONT brings it back live; one that
stops cleanly is marked stopped, never silent; one without its Redis is
degraded, and `webhook_workers_degraded` says so."""

import asyncio
import os
import signal

import aiohttp
import asyncpg
import pytest

from tests.support.events import make_event, publish_events
from tests.support.processes import wait_for_output, wait_until
from tests.support.tcpproxy import free_port

pytestmark = pytest.mark.slow

TOKEN = "operator-token-for-the-heartbeat-tests"
BEAT = {"WEBHOOK_INGEST_HEARTBEAT_SECONDS": "0.5"}


async def workers(base: str) -> dict[int, dict]:
    """GET /admin/workers, by pid."""
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as session,
        session.get(f"{base}/admin/workers") as response,
    ):
        assert response.status == 200, await response.text()
        return {row["pid"]: row for row in await response.json()}


async def gauge(base: str, name: str) -> float:
    async with aiohttp.ClientSession() as session, session.get(f"{base}/metrics") as response:
        text = await response.text()
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith(f"{name} "))


async def silent_gauge(base: str) -> float:
    return await gauge(base, "webhook_workers_silent")


async def processed_per_minute(database_url: str) -> int:
    """What the overview's chart adds up: the processed of every minute the workers reported."""
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetchval("SELECT coalesce(sum(processed), 0) FROM worker_minutes")
    finally:
        await connection.close()


def state(row: dict) -> str:
    return "stopped" if row["stopped_at"] else "silent" if row["silent"] else "live"


async def test_workers_report_themselves_a_paused_one_is_silent_and_a_stopped_one_says_so(fleet, settings):
    _, base = fleet.ingress(env={"WEBHOOK_INGEST_ADMIN_TOKEN": TOKEN, **BEAT})
    first, second = fleet.worker(env=BEAT), fleet.worker(env=BEAT)
    without_redis = fleet.worker(env={**BEAT, "REDIS_URLS": f"redis://127.0.0.1:{free_port()}/0"})
    for worker in (first, second, without_redis):
        await wait_for_output(worker, "worker_consuming")

    async def both_live() -> bool:
        try:
            seen = await workers(base)
        except aiohttp.ClientError:
            return False  # the ingress is still starting
        return all(pid in seen and state(seen[pid]) == "live" for pid in (first.pid, second.pid))

    await wait_until(both_live, 30, interval=0.2, message="both workers live on /admin/workers")
    row = (await workers(base))[first.pid]
    assert row["worker_id"] == f"worker@{os.uname().nodename}:{first.pid}"
    assert row["pool_size"] > 0 and row["degraded"] is False

    await publish_events(settings.amqp_url, settings.namespace, [make_event("demo", f"evt_{n}") for n in range(20)])

    async def all_counted() -> bool:
        return await processed_per_minute(settings.database_url) == 20

    await wait_until(all_counted, 30, interval=0.2, message="20 processed in the workers' minutes")

    async def one_degraded() -> bool:  # its Redis calls failed: it runs on Postgres alone
        seen = await workers(base)
        return seen[without_redis.pid]["degraded"] and await gauge(base, "webhook_workers_degraded") == 1

    await wait_until(one_degraded, 30, interval=0.2, message="the worker without Redis degraded, the gauge at 1")
    assert not any(row["degraded"] for pid, row in (await workers(base)).items() if pid != without_redis.pid)

    os.kill(second.pid, signal.SIGSTOP)
    try:

        async def second_silent() -> bool:
            seen = await workers(base)
            return state(seen[second.pid]) == "silent" and await silent_gauge(base) == 1

        await wait_until(second_silent, 30, interval=0.2, message="the paused worker silent, the gauge at 1")
        assert state((await workers(base))[first.pid]) == "live"
    finally:
        os.kill(second.pid, signal.SIGCONT)

    async def second_back() -> bool:
        return state((await workers(base))[second.pid]) == "live" and await silent_gauge(base) == 0

    await wait_until(second_back, 30, interval=0.2, message="the continued worker live again, the gauge at 0")

    assert await asyncio.to_thread(first.terminate) == 0
    seen = await workers(base)
    assert state(seen[first.pid]) == "stopped"
    assert (seen[first.pid]["in_flight"], seen[first.pid]["keys_held"]) == (0, 0)

    async def stopped_past_its_silence() -> bool:  # a gauge read after the row would have turned silent
        row = (await workers(base))[first.pid]
        return row["seen_seconds_ago"] > 4 * 0.5 and state(row) == "stopped" and await silent_gauge(base) == 0

    await wait_until(stopped_past_its_silence, 30, interval=0.2, message="a stopped worker is never counted silent")
