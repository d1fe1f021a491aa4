"""The runner with real worker processes, fed without an ingress: each event
inserted into its lane (`insert_ordered`, one commit each) and a wake-up
published when the lane went idle -> busy. What only the runner decides —
how fast a full runner takes the lanes waiting for it, which lanes it
will not take. The guarantees themselves (order among lanes, retries in
place, a holder killed or stopped, hold, stale, pause) are
tests/acceptance/test_ordering.py's, through the ingress."""

import asyncio
from dataclasses import replace
from decimal import Decimal

import aio_pika
import asyncpg
import pytest

from tests.support.events import make_event
from tests.support.ordering_handlers import ORDERING_TABLES
from tests.support.ordering_runs import fetch, until_runs
from tests.support.processes import wait_for_output
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.ordering import insert_ordered, ordered_row

pytestmark = [pytest.mark.slow]

HANDLER = "tests.support.ordering_handlers:record_version"


@pytest.fixture
async def tables(database):
    connection = await asyncpg.connect(database)
    try:
        await connection.execute(ORDERING_TABLES)
    finally:
        await connection.close()


def write_sources(path, database_url: str, ordering: str = "") -> str:
    path.write_text(
        f"""
[sources.acme]
scheme = "hmac-sha256"
secrets = ["s"]
handler = "{HANDLER}"
max_attempts = 5
retry_delays = [0.5]
handler_options = {{ database_url = "{database_url}", max_sleep = "0.03" }}

[sources.acme.ordering]
key = "body:object"
{ordering}
"""
    )
    return str(path)


class Feeder:
    """Accepts events into their lanes as the ingress would: one commit each, a wake-up when one goes busy."""

    def __init__(self, settings):
        self._settings = settings

    async def __aenter__(self):
        self._db = await asyncpg.create_pool(self._settings.database_url, min_size=1, max_size=4)
        self._broker = await aio_pika.connect(self._settings.amqp_url)
        self._channel = await self._broker.channel(publisher_confirms=True)
        await topology.declare_ordering_queue(self._channel, self._settings.namespace)
        return self

    async def __aexit__(self, *exc):
        await self._broker.close()
        await self._db.close()

    async def send(self, obj: str, version: int, by: bool = False, **fields) -> None:
        event = make_event("acme", f"evt_{obj}_{version}", {"object": obj, "version": version, **fields})
        [accepted] = await insert_ordered(
            self._db, [ordered_row(event, f"acme:{obj}", Decimal(version) if by else None)]
        )
        if accepted.woke:
            await topology.publish_wake(self._channel, self._settings.namespace, accepted.lane)

    async def lane(self, obj: str, versions, **fields) -> None:
        for version in versions:
            await self.send(obj, version, **fields)


async def test_a_burst_over_more_lanes_than_the_concurrency_runs_every_lane_once(settings, fleet, tmp_path, tables):
    """Eighty lanes of one short event each, accepted at once, on a worker of
    --concurrency 4: most lanes' wake-ups reach the worker while its four
    slots are busy (acked: the rows are in Postgres). Each lane still runs,
    once. That a freed slot takes the lanes offered meanwhile at once, not
    at the watchdog's next round, is the unit test's
    (tests/unit/workers/ordering/test_runner.py,
    test_lanes_offered_while_full_are_taken_in_order_as_slots_free_without_a_look):
    a time bound here measured the host, not the runner."""
    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", settings.database_url)}
    worker = fleet.worker("--concurrency", "4", env=env)
    await wait_for_output(worker, "worker_consuming")
    async with Feeder(settings) as feeder:
        await asyncio.gather(*(feeder.send(f"obj_{n}", 1, sleep=0.01) for n in range(80)))
    await until_runs(settings.database_url, 80, timeout=60)
    runs = await fetch(settings.database_url, "SELECT object, count(*) AS runs FROM version_runs GROUP BY object")
    assert len(runs) == 80 and {row["runs"] for row in runs} == {1}, runs


async def test_a_lane_of_a_route_the_worker_does_not_know_is_not_run_in_a_crash_loop(settings, fleet, tmp_path, tables):
    """Rows wait in `acme#billing:o1`; the sources file has no route
    `billing` (removed while its lane held rows, or not in this worker's
    file yet). A message for such a route waits in a delay queue, then is a
    dead letter after UNKNOWN_SOURCE_PATIENCE (worker._unknown_source). The
    runner offers the lane (its source is known), takes it and runs the row:
    Processor.call_handler's handler_for raises KeyError, not a handler's
    failure, so `lane_crashed` (a stack trace), the lane released (no
    delivery counted), and the watchdog takes it again a second later."""
    path = tmp_path / "s.toml"
    path.write_text(
        f"""
[sources.acme]
scheme = "hmac-sha256"
secrets = ["s"]

[[sources.acme.routes]]
name = "audit"
handler = "{HANDLER}"
handler_options = {{ database_url = "{settings.database_url}" }}
ordering = {{ key = "body:object" }}
"""
    )
    event = make_event("acme", "evt_b1", {"object": "o1", "version": 1})
    routed = replace(event, key=f"{event.key}#billing", route="billing")
    connection = await asyncpg.connect(settings.database_url)
    try:
        await insert_ordered(connection, [ordered_row(routed, "acme#billing:o1", None)])
    finally:
        await connection.close()
    worker = fleet.worker("--concurrency", "4", env={"WEBHOOK_INGEST_SOURCES": str(path)})
    await wait_for_output(worker, "worker_consuming")
    await asyncio.sleep(4)
    crashes = worker.output().count("lane_crashed")
    assert crashes <= 1, f"{crashes} lane_crashed in 4 s"
