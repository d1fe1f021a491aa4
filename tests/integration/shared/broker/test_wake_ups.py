"""Ordering keys' wake-ups (shared/broker/topology.py): one message in
NS.ordering naming its lane, nothing else; a publish to a queue not
declared raises (mandatory), as an event's does."""

import aio_pika
import pytest

from tests.support import broker
from webhook_ingest.shared.broker import topology


@pytest.fixture
async def channel(namespace):
    connection = await aio_pika.connect(broker.amqp_url())
    async with connection:
        yield await connection.channel(publisher_confirms=True, on_return_raises=True)


async def test_a_wake_up_names_its_lane_and_carries_nothing_else(channel, namespace):
    queue = await topology.declare_ordering_queue(channel, namespace)
    assert queue.name == topology.ordering_queue(namespace) == f"{namespace}.ordering"
    await topology.publish_wake(channel, namespace, "acme#billing:cus_1")
    await topology.publish_wake(channel, namespace, "acme:cus_2")
    first = await queue.get(timeout=5)
    second = await queue.get(timeout=5)
    assert [topology.woken_lane(first), topology.woken_lane(second)] == ["acme#billing:cus_1", "acme:cus_2"]
    assert first.body == b"" and first.message_id != second.message_id
    await first.ack()
    await second.ack()


async def test_a_wake_up_without_its_queue_raises(channel, namespace):
    with pytest.raises(aio_pika.exceptions.DeliveryError):
        await topology.publish_wake(channel, namespace, "acme:cus_1")
