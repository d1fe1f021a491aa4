"""What the ordering tests read of their runs: the recorded effects
(tests.support.ordering_handlers' `version_runs`, `version_starts`) by
lane, whether a lane ran in order, a pause, a process's CPU."""

import asyncio
import itertools
import os
from collections import defaultdict

import asyncpg

from tests.support.processes import count_rows, wait_until
from webhook_ingest.shared.audit import Actor
from webhook_ingest.shared.sources import PauseStore


async def fetch(database_url: str, sql: str, *args) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetch(sql, *args)
    finally:
        await connection.close()


async def runs_by_lane(database_url: str) -> dict[str, list[asyncpg.Record]]:
    """Each lane's effects (version_runs), in the order their runs started."""
    lanes: dict[str, list[asyncpg.Record]] = defaultdict(list)
    for run in await fetch(database_url, "SELECT * FROM version_runs ORDER BY started"):
        lanes[run["object"]].append(run)
    return lanes


async def until_runs(database_url: str, count: int, timeout: float = 60) -> None:
    async def done() -> bool:
        return await count_rows(database_url, "version_runs") >= count

    await wait_until(done, timeout, interval=0.1, message=f"{count} effects")


def out_of_order(runs: list[asyncpg.Record], versions: list[int]) -> list[str]:
    """What breaks "one after another in the order accepted": versions not
    run once each in order, or a run that began before the previous one's ended."""
    problems = []
    if [run["version"] for run in runs] != versions:
        problems.append(f"versions ran as {[run['version'] for run in runs]}, sent as {versions}")
    for earlier, later in itertools.pairwise(runs):
        if later["started"] < earlier["ended"]:
            problems.append(f"version {later['version']} began before version {earlier['version']} ended")
    return problems


async def starts_of(database_url: str, version: int, count: int) -> list[asyncpg.Record]:
    """The first `count` starts of `version` of lane a, once there are that many."""

    async def started() -> list[asyncpg.Record] | None:
        rows = await fetch(
            database_url,
            "SELECT pid, started FROM version_starts WHERE object = 'a' AND version = $1 ORDER BY started",
            version,
        )
        return rows[:count] if len(rows) >= count else None

    found = await wait_until(started, 60, message=f"{count} starts of version {version}")
    return list(found)


async def change_pause(database_url: str, pause: bool) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        store = PauseStore(connection)
        assert await (store.pause if pause else store.resume)("acme", Actor.cli())
    finally:
        await connection.close()


async def cpu_over(pid: int, seconds: float) -> float:
    """CPU seconds (user + system) process `pid` used over the next `seconds`."""
    before = cpu_seconds(pid)
    await asyncio.sleep(seconds)
    return cpu_seconds(pid) - before


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
