"""Accepting while RabbitMQ is away (docs/reference.md §6): the Postgres
outbox and its relay, with real ingress and worker processes. The ingress
reaches the broker through a TCP proxy the test cuts; workers reach it
directly.

Effects are counted with tests.support.handlers:counted_inbox (one
`effects` row per run), so an event processed twice shows as two rows.
"""

import asyncio

import aiohttp
import asyncpg
import orjson
import pytest

from tests.support.broker import amqp_port
from tests.support.events import make_event, queue_depth
from tests.support.exactly_once import SECRET, assert_each_once, metered_worker, until_completed, write_sources
from tests.support.processes import count_rows, wait_for_output, wait_until
from tests.support.tcpproxy import TcpProxy
from webhook_ingest.ingress.publishing.outbox import QUERIES, outbox_columns, outbox_row
from webhook_ingest.shared import signatures
from webhook_ingest.shared.broker import topology

pytestmark = pytest.mark.usefixtures("effects_tables")

HANDLER = "tests.support.handlers:counted_inbox"


@pytest.fixture
def broker_proxy(settings):
    with TcpProxy("127.0.0.1", amqp_port()) as proxy:
        yield proxy


@pytest.fixture
def env(tmp_path):
    return {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", HANDLER)}


async def test_broker_away_from_the_start_then_back_every_event_once(settings, fleet, env, broker_proxy):
    """Cut before the ingress starts: 200 deliveries all answered 200 and
    queued nowhere; the broker back, all 200 processed once, no restart."""
    broker_proxy.cut()
    _, base_url = fleet.ingress(env={**env, "AMQP_URL": broker_proxy.url_for(settings.amqp_url)})
    worker = fleet.worker("--concurrency", "32", env=env)
    await wait_for_output(worker, "worker_consuming")
    events = event_bodies(range(200))

    assert await post_all(base_url, events) == {200: 200}
    assert await count_rows(settings.database_url, "outbox") == 200
    assert await queue_depth(settings.amqp_url, topology.events_queue(settings.namespace)) == 0
    assert await count_rows(settings.database_url, "effects") == 0

    broker_proxy.restore()
    await until_completed(settings.database_url, 200, timeout=60)
    await settle(settings)
    await assert_each_once(settings.database_url, keys_of(events))


async def test_broker_cut_and_restored_under_load_every_delivery_200_and_once(settings, fleet, env, broker_proxy):
    ingress, base_url = fleet.ingress(env={**env, "AMQP_URL": broker_proxy.url_for(settings.amqp_url)})
    workers = [metered_worker(fleet, env, "--concurrency", "32")[0] for _ in range(2)]  # started together
    for worker in workers:
        await wait_for_output(worker, "worker_consuming")
    await until_ready(base_url, via="broker")
    before, during, after = event_bodies(range(0, 150)), event_bodies(range(150, 450)), event_bodies(range(450, 600))

    statuses = await post_all(base_url, before)
    answered: dict[int, int] = {}
    load = asyncio.create_task(post_all(base_url, during, connections=8, statuses=answered))
    await wait_until(lambda: _answered(answered, 60), 30, interval=0.01, message="60 answers")
    broker_proxy.cut()  # while requests are in flight
    await wait_until(lambda: _answered(answered, 200), 30, interval=0.01, message="200 answers")
    broker_proxy.restore()
    statuses = merge(statuses, await load)
    assert await count_rows(settings.database_url, "outbox") > 0 or "outbox_relayed" in ingress.output()
    await until_ready(base_url, via="broker")  # reconnected by itself
    statuses = merge(statuses, await post_all(base_url, after))

    assert statuses == {200: 600}
    await until_completed(settings.database_url, 600, timeout=60)
    await settle(settings)
    await assert_each_once(settings.database_url, keys_of(before + during + after))


async def _answered(statuses: dict[int, int], count: int) -> bool:
    return sum(statuses.values()) >= count


@pytest.mark.alone  # 150 req/s with a bound of 64 at once: another test beside it is a capacity fault
@pytest.mark.parametrize("commit_seconds", [0, 0.1], ids=["prompt-commits", "slow-commits"])
async def test_broker_stalled_under_load_every_delivery_200_and_once(
    settings, fleet, env, broker_proxy, commit_seconds
):
    """The broker path stalls (connections open, nothing answered: a hung
    broker, or one blocked by an alarm) under a steady 150 req/s: more
    requests than the ingress's bound of 64 at once would wait out their
    1 s for a confirm. Still every delivery gets 200 while the outbox takes
    inserts, and every event is processed once, including those whose
    given-up publish the broker confirms once it answers again (copies).
    slow-commits: every outbox statement takes 0.1 s more (a synchronous
    standby far away), so one commit per event could not keep up."""
    await slow_outbox_statements(settings.database_url, commit_seconds)
    bounded = {
        **env,
        "AMQP_URL": broker_proxy.url_for(settings.amqp_url),
        "WEBHOOK_INGEST_MAX_CONCURRENT_REQUESTS": "64",
    }
    ingress, base_url = fleet.ingress(env=bounded)
    workers = [metered_worker(fleet, env, "--concurrency", "32")[0] for _ in range(2)]  # started together
    for worker in workers:
        await wait_for_output(worker, "worker_consuming")
    await until_ready(base_url, via="broker")
    events = event_bodies(range(900))

    answered: dict[int, int] = {}
    load = asyncio.create_task(post_at_rate(base_url, events, 150, answered))
    await wait_until(lambda: _answered(answered, 150), 60, interval=0.01, message="150 answers")
    broker_proxy.stall()
    await wait_until(lambda: _answered(answered, 600), 60, interval=0.01, message="600 answers")
    broker_proxy.flow()
    statuses = await load

    assert statuses == {200: 900}
    assert "stored_in_outbox" in ingress.output()
    await until_completed(settings.database_url, 900, timeout=90)
    await settle(settings)
    await assert_each_once(settings.database_url, keys_of(events))


async def test_outbox_outlives_a_killed_ingress(settings, fleet, env, broker_proxy):
    """300 events in the outbox, the ingress SIGKILLed, the broker back, a
    new ingress process: its relay publishes all 300, each processed once."""
    broker_proxy.cut()
    first, base_url = fleet.ingress(env={**env, "AMQP_URL": broker_proxy.url_for(settings.amqp_url)})
    events = event_bodies(range(300))
    assert await post_all(base_url, events) == {200: 300}
    first.kill()
    assert await count_rows(settings.database_url, "outbox") == 300

    broker_proxy.restore()
    fleet.ingress(env=env)
    worker = fleet.worker("--concurrency", "32", env=env)
    await wait_for_output(worker, "worker_consuming")
    await until_completed(settings.database_url, 300, timeout=60)
    await settle(settings)
    await assert_each_once(settings.database_url, keys_of(events))


async def test_two_ingresses_drain_one_outbox_without_publishing_a_row_twice(settings, fleet, env):
    """2,000 rows stored as the ingress stores them; two ingress processes
    started together both relay; the queue then holds exactly one message
    per row (a row published twice would be a second message)."""
    events = [make_event("acme", f"evt_{n}") for n in range(2000)]
    await store_in_outbox(settings.database_url, events)
    relays = [fleet.ingress(env=env)[0] for _ in range(2)]

    await wait_until(lambda: _outbox_empty(settings), 60, message="the outbox drained")
    assert await queue_depth(settings.amqp_url, topology.events_queue(settings.namespace)) == 2000
    assert all("outbox_relayed" in relay.output() for relay in relays), "both relays took part"

    worker = fleet.worker("--concurrency", "32", env=env)
    await wait_for_output(worker, "worker_consuming")
    await until_completed(settings.database_url, 2000, timeout=90)
    await settle(settings)
    await assert_each_once(settings.database_url, events)


async def _outbox_empty(settings) -> bool:
    return await count_rows(settings.database_url, "outbox") == 0


# -- helpers ------------------------------------------------------------------


def event_bodies(numbers) -> list[bytes]:
    return [orjson.dumps({"id": f"evt_{n}", "type": "test.event"}) for n in numbers]


def keys_of(bodies: list[bytes]) -> list:
    return [make_event("acme", orjson.loads(body)["id"]) for body in bodies]


def merge(*counts: dict[int, int]) -> dict[int, int]:
    total: dict[int, int] = {}
    for count in counts:
        for status, n in count.items():
            total[status] = total.get(status, 0) + n
    return total


async def post_all(
    base_url: str, bodies: list[bytes], connections: int = 32, statuses: dict[int, int] | None = None
) -> dict[int, int]:
    """Status code -> count; `statuses` (if given) fills as answers come."""
    await until_ready(base_url)
    limit = asyncio.Semaphore(connections)
    statuses = {} if statuses is None else statuses
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections)) as session:

        async def post(body: bytes) -> None:
            headers = signatures.sign("hmac-sha256", body, SECRET) | {"Content-Type": "application/json"}
            async with limit, session.post(f"{base_url}/webhooks/acme", data=body, headers=headers) as response:
                await response.read()
                statuses[response.status] = statuses.get(response.status, 0) + 1

        await asyncio.gather(*(post(body) for body in bodies))
    return statuses


async def post_at_rate(base_url: str, bodies: list[bytes], rate: float, statuses: dict[int, int]) -> dict[int, int]:
    """Open loop: one request every 1/`rate` s whatever the answers do, as
    providers send, each on a connection of its own if need be."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def post(body: bytes) -> None:
            headers = signatures.sign("hmac-sha256", body, SECRET) | {"Content-Type": "application/json"}
            async with session.post(f"{base_url}/webhooks/acme", data=body, headers=headers) as response:
                await response.read()
                statuses[response.status] = statuses.get(response.status, 0) + 1

        loop, posts = asyncio.get_running_loop(), []
        started = loop.time()
        for n, body in enumerate(bodies):
            await asyncio.sleep(max(0.0, started + n / rate - loop.time()))
            posts.append(asyncio.create_task(post(body)))
        await asyncio.gather(*posts)
    return statuses


async def slow_outbox_statements(database_url: str, seconds: float) -> None:
    """Every INSERT statement on the outbox takes `seconds` more (none for 0)."""
    if not seconds:
        return
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(f"""
            CREATE FUNCTION slow_statement() RETURNS trigger LANGUAGE plpgsql
                AS $$ BEGIN PERFORM pg_sleep({seconds}); RETURN NULL; END $$;
            CREATE TRIGGER slow_outbox AFTER INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION slow_statement();
        """)
    finally:
        await connection.close()


async def until_ready(base_url: str, via: str | None = None) -> None:
    async def ready() -> bool:
        try:
            async with aiohttp.ClientSession() as session, session.get(f"{base_url}/readyz") as response:
                return response.status == 200 and via in (None, (await response.json())["via"])
        except aiohttp.ClientError:
            return False

    await wait_until(ready, 60, interval=0.1, message=f"the ingress ready via {via or 'any path'}")


async def settle(settings) -> None:
    """The queue and the outbox empty, then a moment for any copy in flight."""

    async def empty() -> bool:
        depth = await queue_depth(settings.amqp_url, topology.events_queue(settings.namespace))
        return depth == 0 and await count_rows(settings.database_url, "outbox") == 0

    await wait_until(empty, 30, message="an empty queue and outbox")
    await asyncio.sleep(1)


async def store_in_outbox(database_url: str, events) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(QUERIES["store_in_outbox"], *outbox_columns([outbox_row(e) for e in events]))
    finally:
        await connection.close()
