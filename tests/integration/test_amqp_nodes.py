"""`AMQP_URL` listing several nodes: connect to one that answers, move to
another when it stops. The "nodes" are two TCP proxies in front of the one
real broker, each cut in turn."""

import asyncio

import aio_pika
import pytest

from tests.support.broker import amqp_port
from tests.support.processes import wait_until
from tests.support.tcpproxy import TcpProxy
from webhook_ingest.shared.broker import amqp

QUICK = "?reconnect_interval=0.2"


@pytest.fixture
def two_nodes(settings):
    with TcpProxy("127.0.0.1", amqp_port()) as first, TcpProxy("127.0.0.1", amqp_port()) as second:
        yield first, second, ",".join(proxy.url_for(settings.amqp_url) + QUICK for proxy in (first, second))


def test_node_urls_split_on_commas():
    assert amqp.node_urls(" amqp://a/ , amqp://b/,") == ["amqp://a/", "amqp://b/"]
    with pytest.raises(ValueError):
        amqp.node_urls(" , ")


async def test_connects_to_the_node_that_answers(two_nodes):
    first, second, amqp_url = two_nodes
    first.cut()
    connection = await amqp.connect(amqp_url)
    await connection.close()
    robust = await amqp.connect_robust(amqp_url)
    try:
        assert robust.url.port == second.port
    finally:
        await robust.close()


async def test_a_robust_connection_moves_to_the_next_node_when_its_own_stops(two_nodes, namespace):
    first, second, amqp_url = two_nodes
    connection = await amqp.connect_robust(amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(f"{namespace}.nodes", durable=True, arguments={"x-queue-type": "quorum"})
        assert connection.url.port == first.port
        first.cut()
        await wait_until(lambda: _connected_through(connection, second.port), 30, message="moved to the second node")
        second.cut()
        first.restore()
        await wait_until(lambda: _connected_through(connection, first.port), 30, message="back on the first node")
        await _wait_open(channel)
        await channel.default_exchange.publish(aio_pika.Message(b"x"), routing_key=queue.name, timeout=5)
        await channel.queue_delete(queue.name)
    finally:
        await connection.close()


async def _connected_through(connection, port: int) -> bool:
    return connection.connected.is_set() and connection.url.port == port


async def _wait_open(channel) -> None:
    for _ in range(100):
        if not channel.is_closed:
            return
        await asyncio.sleep(0.05)
