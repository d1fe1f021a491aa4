"""Every broker wait has a limit: a publish through a broker that hangs (an
alarm, a stalled network) ends with an error instead of waiting for ever
(the ingress then answers from the outbox or 503; a worker lets the broker
redeliver)."""

import asyncio
import signal
import subprocess

import aio_pika
import pytest

from tests.support.broker import amqp_port
from tests.support.events import make_event, queue_depth
from tests.support.processes import Process, wait_for_output, wait_until
from tests.support.tcpproxy import TcpProxy
from webhook_ingest.shared.broker import amqp, topology
from webhook_ingest.workers.claim.retry import FailurePolicy

GUARD_SECONDS = 60  # only so that a regression fails instead of hanging the suite


async def publish_outcome(channel, namespace: str) -> BaseException | None:
    """What a publish with the default limit (as the workers' retry publish makes it) ended with."""
    message = aio_pika.Message(b"{}")
    task = asyncio.create_task(topology.publish(channel, message, topology.events_queue(namespace)))
    done, _ = await asyncio.wait({task}, timeout=GUARD_SECONDS)
    if task not in done:
        task.cancel()
        pytest.fail("the publish was still waiting")
    return task.exception()


@pytest.fixture
async def proxied_channel(settings):
    with TcpProxy("127.0.0.1", amqp_port()) as proxy:
        connection = await aio_pika.connect_robust(proxy.url_for(settings.amqp_url))
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        await topology.declare_events_queue(channel, settings.namespace, settings.delivery_limit)
        yield proxy, channel
        proxy.flow()
        proxy.restore()
        await connection.close()


async def test_a_publish_to_a_hung_broker_ends_within_its_limit(settings, proxied_channel):
    proxy, channel = proxied_channel
    proxy.stall()
    assert isinstance(await publish_outcome(channel, settings.namespace), asyncio.TimeoutError)


async def test_a_retry_publish_the_broker_takes_late_is_published_once(settings, proxied_channel):
    """The broker hangs (an alarm) for two publish limits and more while a
    worker publishes a failed event's retry, then takes publishes again. The
    worker waits for that publish's confirm instead of publishing again:
    each publish that timed out would still reach the broker, and each retry
    message is a retry chain of its own (adversary finding 8)."""
    proxy, channel = proxied_channel
    await topology.declare_retry_queue(channel, settings.namespace, 600)  # its messages stay to be counted
    failures = FailurePolicy(channel, None, settings.namespace)
    proxy.stall()
    delaying = asyncio.create_task(failures.delay(make_event("acme", "evt_late_confirm"), 600))
    await asyncio.sleep(topology.PUBLISH_TIMEOUT * 2 + 1)
    proxy.flow()
    await asyncio.wait_for(delaying, GUARD_SECONDS)
    assert await queue_depth(settings.amqp_url, topology.retry_queue(settings.namespace, 600)) == 1


async def test_dlq_replay_against_a_broker_that_hangs_after_connecting_is_one_error(settings, monkeypatch):
    """The replay command's channel and queue check waited for ever once connected."""
    from webhook_ingest.cli import dlq

    with TcpProxy("127.0.0.1", amqp_port()) as proxy:
        connect = dlq.amqp.connect

        async def connect_then_hang(*args, **kwargs):
            connection = await connect(*args, **kwargs)
            proxy.stall()
            await asyncio.sleep(0.1)  # the proxy's loop has stalled
            return connection

        monkeypatch.setattr(dlq.amqp, "connect", connect_then_hang)
        monkeypatch.setattr(dlq, "CONNECT_TIMEOUT", 1.0)
        monkeypatch.setenv("AMQP_URL", proxy.url_for(settings.amqp_url))

        async def open_channel():
            async with dlq.confirm_channel(type(settings)()):
                pass

        task = asyncio.create_task(open_channel())
        done, _ = await asyncio.wait({task}, timeout=GUARD_SECONDS)
        if task not in done:
            task.cancel()
            pytest.fail("the replay was still waiting for the broker")
        proxy.flow()
    assert isinstance(task.exception(), dlq.BrokerUnavailable)


async def test_a_publish_while_the_robust_connection_reconnects_ends_within_its_limit(settings):
    """Between a lost connection and its recovery aio-pika's robust channel
    waits for the connection, before its own publish timeout starts. That
    state, held: the connection's `connected` event cleared, as a reconnect
    leaves it, on an otherwise healthy connection."""
    connection = await aio_pika.connect_robust(settings.amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        await topology.declare_events_queue(channel, settings.namespace, settings.delivery_limit)
        connection.connected.clear()
        task = asyncio.create_task(
            topology.publish(channel, aio_pika.Message(b"{}"), topology.events_queue(settings.namespace), timeout=1.0)
        )
        done, _ = await asyncio.wait({task}, timeout=GUARD_SECONDS)
        if task not in done:
            task.cancel()
            pytest.fail("the publish was still waiting for the connection")
        assert isinstance(task.exception(), asyncio.TimeoutError)
    finally:
        connection.connected.set()
        await connection.close()


# `AMQP_URL` listing several nodes: connect to one that answers, move to
# another when it stops. The "nodes" are two TCP proxies in front of the one
# real broker, each cut in turn.

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


# The ingress stops when told to, however its connection to RabbitMQ closes:
# a real `webhook-ingest ingress` whose socket is made slow (or unable) to
# close, as a TLS connection is while the broker does not answer its
# close_notify — a prelude swaps the writer class the connection uses.

WRITERS = """
import asyncio
from webhook_ingest.ingress.publishing import publisher
from webhook_ingest.shared.broker import coalesced_writes


class SlowlyClosing(coalesced_writes.CoalescingWriter):
    async def wait_closed(self):
        await asyncio.sleep(1.0)
        await super().wait_closed()


class NeverClosing(coalesced_writes.CoalescingWriter):  # the socket never closes: only an abort ends it
    def write_eof(self):
        self.flush()

    def close(self):
        self.flush()
"""
SLOWLY_CLOSING = WRITERS + "coalesced_writes.CoalescingWriter = SlowlyClosing\n"
NEVER_CLOSING = WRITERS + "coalesced_writes.CoalescingWriter = NeverClosing\npublisher.CLOSE_TIMEOUT = 0.5\n"


async def exit_code(process: Process, within: float) -> int | None:
    try:
        return await asyncio.to_thread(process.popen.wait, within)
    except subprocess.TimeoutExpired:
        return None


async def test_an_ingress_told_twice_to_stop_while_its_broker_connection_closes_exits(fleet):
    ingress, _ = fleet.ingress(prelude=SLOWLY_CLOSING)
    await wait_for_output(ingress, "broker_connected")
    ingress.popen.send_signal(signal.SIGINT)
    await asyncio.sleep(0.3)  # its connection is closing: Close-Ok came, the socket's close takes 1 s
    ingress.popen.send_signal(signal.SIGTERM)
    assert await exit_code(ingress, within=5) == 0, ingress.output()


async def test_an_ingress_whose_broker_connection_does_not_close_exits_after_its_limit(fleet):
    ingress, _ = fleet.ingress(prelude=NEVER_CLOSING)
    await wait_for_output(ingress, "broker_connected")
    ingress.popen.send_signal(signal.SIGTERM)
    assert await exit_code(ingress, within=5) == 0, ingress.output()
