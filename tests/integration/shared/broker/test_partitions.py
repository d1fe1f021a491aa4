"""The events queue in partitions (WEBHOOK_INGEST_EVENT_QUEUES=3, docs/reference.md §9):
every path that publishes an event — the ingress, its outbox relay, a dead
letter's replay, an events replay, a resumed source, a retry coming back —
puts it on its key's partition, `NS.events.<crc32(key) mod 3>`, and never
on `NS.events`; a worker consumes them all and fans a routed event out to
each route's partition. A fleet at N=3, exactly once: tests/acceptance/test_exactly_once.py."""

import asyncio
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import aio_pika
import asyncpg
import pytest

from tests.support.archive import archived_event, seed_archive
from tests.support.dead_letters import seed_dead_letters
from tests.support.events import make_event
from tests.support.ingress import running_ingress
from tests.support.processes import wait_until
from tests.support.signing import PROVIDER_SECRETS
from webhook_ingest.ingress.publishing.outbox import QUERIES as OUTBOX_SQL
from webhook_ingest.ingress.publishing.outbox import outbox_columns, outbox_row
from webhook_ingest.shared import signatures
from webhook_ingest.shared.audit.actor import Actor
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.dead_letters.store import DeadLetterStore
from webhook_ingest.shared.event.message import from_amqp, to_amqp
from webhook_ingest.shared.replays.model import ReplayItem
from webhook_ingest.shared.replays.store import EventReplayStore
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources
from webhook_ingest.workers.claim.retry import FailurePolicy
from webhook_ingest.workers.pauses import Parking
from webhook_ingest.workers.worker import Worker

PARTITIONS = 3
KEYS = 12  # enough that every partition gets some (checked: the test would say so)


@pytest.fixture
async def partitioned(settings, monkeypatch) -> AsyncIterator[Settings]:
    """This test's deployment with three partitions, declared; the process's count back to 1 after."""
    monkeypatch.setenv("WEBHOOK_INGEST_EVENT_QUEUES", str(PARTITIONS))
    topology.set_event_queues(PARTITIONS)
    partitioned = Settings()
    connection = await aio_pika.connect(partitioned.amqp_url)
    async with connection:
        await topology.ensure_events_queue(connection, partitioned.namespace, partitioned.delivery_limit)
    try:
        yield partitioned
    finally:
        topology.set_event_queues(1)


@pytest.fixture
def sources(tmp_path):
    path = tmp_path / "sources.toml"
    secret = PROVIDER_SECRETS["hmac-sha256"]
    path.write_text(f'[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["{secret}"]\nhandler = "inbox"\n')
    return load_sources(str(path))


async def keys_by_queue(settings: Settings) -> dict[str, list[str]]:
    """Each events queue's keys, taken off it; NS.events too, which must stay absent."""
    connection = await aio_pika.connect(settings.amqp_url)
    found: dict[str, list[str]] = {}
    async with connection:
        for name in [topology.events_queue(settings.namespace), *topology.events_queues(settings.namespace)]:
            channel = await connection.channel()
            try:
                queue = await channel.declare_queue(name, passive=True)
            except aio_pika.exceptions.ChannelNotFoundEntity:
                continue
            keys = []
            while (message := await queue.get(no_ack=True, fail=False)) is not None:
                keys.append(from_amqp(message.body, message.headers).key)
            found[name] = sorted(keys)
            await channel.close()
    return found


def by_partition(settings: Settings, keys) -> dict[str, list[str]]:
    """Where each key must be: its partition, by crc32; every partition, empty or not."""
    expected: dict[str, list[str]] = {name: [] for name in topology.events_queues(settings.namespace)}
    for key in keys:
        expected[topology.events_queue_for(settings.namespace, key)].append(key)
    assert all(expected.values()), f"{KEYS} keys left a partition empty: {expected}"
    return {name: sorted(found) for name, found in expected.items()}


async def confirming_channel(settings: Settings):
    connection = await aio_pika.connect(settings.amqp_url)
    return connection, await connection.channel(publisher_confirms=True, on_return_raises=True)


def test_a_key_s_partition_is_its_crc32_mod_n_and_one_queue_is_ns_events():
    """Stable across processes and releases (Python's `hash` is salted): the
    same function in every publisher, and an operator can compute it."""
    assert topology.partition_of("acme:evt_1", 3) == 2940456682 % 3 == 1
    assert topology.partition_of("acme:evt_1", 1) is None
    assert topology.events_queues("ns", 1) == ["ns.events"]
    assert topology.events_queues("ns", 3) == ["ns.events.0", "ns.events.1", "ns.events.2"]
    assert topology.retry_queue("ns", 10, 2) == "ns.retry.10s.2"


async def test_the_ingress_publishes_each_accepted_event_to_its_key_s_partition(partitioned, sources):
    async with running_ingress(partitioned, sources) as client:
        keys = []
        for n in range(KEYS):
            body = json.dumps({"id": f"evt_{n}", "type": "invoice.paid"}).encode()
            headers = {**signatures.sign("hmac-sha256", body, PROVIDER_SECRETS["hmac-sha256"]), "X-Event-ID": f"e{n}"}
            response = await client.post("/webhooks/acme", data=body, headers=headers)
            assert response.status == 200, await response.text()
            keys.append((await response.json())["key"])
    assert await keys_by_queue(partitioned) == by_partition(partitioned, keys)


async def test_the_outbox_relay_publishes_each_row_to_its_key_s_partition(partitioned, sources):
    events = [make_event("acme", f"evt_{n}") for n in range(KEYS)]
    connection = await asyncpg.connect(partitioned.database_url)
    try:
        await connection.execute(OUTBOX_SQL["store_in_outbox"], *outbox_columns([outbox_row(e) for e in events]))
        async with running_ingress(partitioned, sources):
            await wait_until(
                lambda: _outbox_empty(connection), timeout=30, message="the relay published the outbox's rows"
            )
    finally:
        await connection.close()
    assert await keys_by_queue(partitioned) == by_partition(partitioned, [e.key for e in events])


async def _outbox_empty(connection: asyncpg.Connection) -> bool:
    return await connection.fetchval("SELECT count(*) FROM outbox") == 0


async def test_a_dead_letter_replay_publishes_each_event_to_its_key_s_partition(partitioned):
    ids = await seed_dead_letters(partitioned.database_url, "acme", KEYS)
    broker, channel = await confirming_channel(partitioned)
    async with broker:
        connection = await asyncpg.connect(partitioned.database_url)
        try:
            await DeadLetterStore(connection).replay(channel, partitioned.namespace, ids=ids, actor=Actor.cli())
        finally:
            await connection.close()
    keys = [f"acme:evt_{n}" for n in range(KEYS)]
    assert await keys_by_queue(partitioned) == by_partition(partitioned, keys)


async def test_an_events_replay_publishes_each_event_to_its_key_s_partition(partitioned):
    received = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30)
    arrivals = [archived_event("acme", f"evt_{n}", received + timedelta(seconds=n)) for n in range(KEYS)]
    await seed_archive(partitioned.database_url, arrivals)
    broker, channel = await confirming_channel(partitioned)
    async with broker:
        connection = await asyncpg.connect(partitioned.database_url)
        try:
            for arrival in arrivals:
                item = ReplayItem(1, "acme", arrival.key, datetime.fromtimestamp(arrival.received_at, UTC))
                assert await EventReplayStore(connection).publish(channel, partitioned.namespace, 7, item)
        finally:
            await connection.close()
    found = await keys_by_queue(partitioned)
    published = sorted(key for keys in found.values() for key in keys)
    assert len(published) == KEYS and all(key.startswith("replay-7/") for key in published), published
    assert found == by_partition(partitioned, published)


async def test_a_resumed_source_s_parked_events_go_back_to_their_keys_partitions(partitioned):
    events = [make_event("acme", f"evt_{n}") for n in range(KEYS)]
    broker, channel = await confirming_channel(partitioned)
    async with broker:
        failures = FailurePolicy(channel, None, partitioned.namespace)
        parking = Parking(channel, failures, partitioned.namespace, ["acme"])
        await parking.declare()
        for event in events:
            await parking.park(event)
        assert await parking.move_back(set()) == KEYS  # type: ignore[arg-type]  # nothing paused any more
    assert await keys_by_queue(partitioned) == by_partition(partitioned, [e.key for e in events])


async def test_a_retry_waits_in_its_partition_s_retry_queue_and_returns_to_that_partition(partitioned):
    """A retry queue's dead-lettering names one queue: each partition has its
    own `NS.retry.<delay>s.<n>`, which returns to `NS.events.<n>`."""
    events = [make_event("acme", f"evt_{n}") for n in range(KEYS)]
    broker, channel = await confirming_channel(partitioned)
    async with broker:
        for partition in topology.partitions():
            await topology.declare_retry_queue(channel, partitioned.namespace, 0.2, partition)
        failures = FailurePolicy(channel, None, partitioned.namespace)
        await asyncio.gather(*(failures.delay(event, 0.2) for event in events))
    expected = by_partition(partitioned, [e.key for e in events])

    async def all_back() -> bool:
        depths = await topology.queue_depths(partitioned.amqp_url, list(expected), "test-partitions")
        return sum(depth or 0 for _, depth in depths) == KEYS

    await wait_until(all_back, timeout=15, message="every retry back on an events queue")
    assert await keys_by_queue(partitioned) == expected


ROUTED = (
    '[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["s"]\n'
    '[[sources.acme.routes]]\nname = "billing"\nhandler = "inbox"\n'
    '[[sources.acme.routes]]\nname = "audit"\nhandler = "inbox"\n'
)


async def test_a_worker_consumes_every_partition_and_fans_out_to_each_route_key_s_partition(
    partitioned, tmp_path, monkeypatch
):
    """Events on their partitions; one worker consuming all three fans each
    out into one message a route, `KEY#ROUTE` on that key's partition, and
    runs them all there."""
    path = tmp_path / "routed.toml"
    path.write_text(ROUTED)
    sources = load_sources(str(path))
    published: list[tuple[str, str]] = []
    publish_to = FailurePolicy.publish_to

    async def recorded(self, event, queue_name: str) -> None:
        published.append((event.key, queue_name))
        await publish_to(self, event, queue_name)

    monkeypatch.setattr(FailurePolicy, "publish_to", recorded)
    events = [make_event("acme", f"evt_{n}") for n in range(KEYS)]
    broker, channel = await confirming_channel(partitioned)
    async with broker:
        for event in events:
            await topology.publish(channel, to_amqp(event), topology.events_queue_for(partitioned.namespace, event.key))
    assert {topology.events_queue_for(partitioned.namespace, e.key) for e in events} == set(
        topology.events_queues(partitioned.namespace)
    )
    worker = Worker(partitioned, sources, concurrency=8, grace_seconds=5)
    running = asyncio.create_task(worker.run())
    connection = await asyncpg.connect(partitioned.database_url)
    try:

        async def all_routes_ran() -> bool:
            if running.done():
                running.result()  # its error, rather than a time-out
            return await connection.fetchval("SELECT count(*) FROM processed_events") == 2 * KEYS

        await wait_until(all_routes_ran, timeout=30, message="every route of every event completed")
    finally:
        worker.stop()
        await running
        await connection.close()
    routed = sorted(f"{e.key}#{route}" for e in events for route in ("audit", "billing"))
    assert sorted(key for key, _ in published) == routed
    assert all(queue == topology.events_queue_for(partitioned.namespace, key) for key, queue in published), published
    assert await keys_by_queue(partitioned) == {name: [] for name in topology.events_queues(partitioned.namespace)}
