"""Processes stop on SIGTERM within their limits, whatever their services do
meanwhile: real processes, a service's path cut by a TCP proxy."""

import asyncio
import time

import aiohttp

from tests.support.processes import wait_until
from tests.support.tcpproxy import TcpProxy

# Closing the ingress's Postgres sessions takes at most 2 s (ingress/database.py); the
# rest is the process's own teardown and exit.
INGRESS_STOP_LIMIT = 4.0


async def _ready(base_url: str) -> bool:
    try:
        async with aiohttp.ClientSession() as session, session.get(f"{base_url}/readyz") as response:
            return response.status == 200
    except aiohttp.ClientError:
        return False


async def test_an_ingress_whose_postgres_is_black_holed_stops_within_its_limit(fleet, service_env):
    """The Postgres path black-holed (connections open, nothing answered: a
    partition, a failover that drops the old primary's traffic) while the
    outbox relay's or a gauge's statement waits in it: SIGTERM still ends
    the ingress, at once and with 0, not when the server would have answered."""
    with TcpProxy("127.0.0.1", 5432) as proxy:
        ingress, base_url = fleet.ingress(env={"DATABASE_URL": proxy.url_for(service_env["DATABASE_URL"])})
        await wait_until(lambda: _ready(base_url), timeout=15, message="the ingress ready")
        proxy.stall()

        async def a_statement_waits() -> bool:
            return proxy.holding() > 0

        await wait_until(a_statement_waits, timeout=10, message="a statement sent into the black hole")
        started = time.monotonic()
        try:
            code = await asyncio.to_thread(ingress.terminate, INGRESS_STOP_LIMIT)
        finally:
            ingress.kill()
        assert (code, time.monotonic() - started < INGRESS_STOP_LIMIT) == (0, True), ingress.output()[-2000:]
