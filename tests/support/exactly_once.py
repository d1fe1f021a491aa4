"""Helpers of the exactly-once acceptance tests: a sources file, workers
with metrics, and the checks on `effects` (one row per run of a handler of
tests.support.handlers)."""

import aiohttp
import asyncpg

from tests.support.processes import count_rows, outcomes, wait_until
from tests.support.tcpproxy import free_port

SECRET = "acme-secret"


def write_sources(path, handler: str, **options) -> str:
    text = f'[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["{SECRET}"]\nhandler = "{handler}"\n'
    text += "max_attempts = 3\nretry_delays = [0.5]\n"
    if options:
        text += "handler_options = { " + ", ".join(f'{k} = "{v}"' for k, v in options.items()) + " }\n"
    path.write_text(text)
    return str(path)


def metered_worker(fleet, env: dict, *args: str):
    port = free_port()
    worker = fleet.worker("--metrics-port", str(port), *args, env=env)
    return worker, f"http://127.0.0.1:{port}"


async def effects_by_key(database_url: str) -> dict[str, int]:
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch("SELECT key, count(*) AS runs FROM effects GROUP BY key")
        return {row["key"]: row["runs"] for row in rows}
    finally:
        await connection.close()


async def assert_each_once(database_url: str, events) -> None:
    expected = {event.key: 1 for event in events}
    assert await effects_by_key(database_url) == expected
    assert await count_rows(database_url, "inbox") == len(expected)
    assert await count_rows(database_url, "processed_events") == len(expected)
    assert await count_rows(database_url, "dead_letters") == 0


async def until_completed(database_url: str, count: int, timeout: float = 120) -> None:
    async def done() -> bool:
        return await count_rows(database_url, "processed_events") >= count

    await wait_until(done, timeout, message=f"{count} completions")


async def until_every_message_handled(metrics_urls: list[str], messages: int, timeout: float = 120) -> None:
    """Every copy acked as processed, duplicate or conflict: nothing left in flight."""

    async def handled() -> bool:
        try:
            counts = await outcomes(metrics_urls)
        except aiohttp.ClientConnectionError:  # a worker still starting
            return False
        return sum(counts.get(o, 0) for o in ("processed", "duplicate", "conflict")) >= messages

    await wait_until(handled, timeout, message=f"{messages} messages handled")


async def recorded_runs(database_url: str) -> list[asyncpg.Record]:
    """The external-effect handlers' `runs` rows (one per run, with its interval), oldest first."""
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetch("SELECT key, pid, started, ended FROM runs ORDER BY started")
    finally:
        await connection.close()
