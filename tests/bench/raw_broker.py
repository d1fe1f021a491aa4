"""The broker's own limit on this machine, the yardstick of every ratio:
confirmed persistent 1 KiB publishes to a quorum queue with many in flight,
then a consumer acking each message (prefetch as many). The publishes' CPU
per message — this client's and the broker's — says what a confirmed publish
costs before anything of ours runs."""

import asyncio
import time
import uuid

import aio_pika

from tests.bench.cpu import BrokerCpu

IN_FLIGHT = 256


async def measure(amqp_url: str, queue_name: str, messages: int, rate: float, seconds: float) -> dict[str, float]:
    """Publishes confirmed per second, messages consumed and acked per
    second, and the confirm latency (p50/p99 ms) at a fixed offered `rate`."""
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(queue_name, durable=True, arguments={"x-queue-type": "quorum"})
        try:
            client_before, broker = time.process_time(), BrokerCpu()
            figures = {"raw_publish_rps": await _publish(channel, queue_name, messages)}
            figures["raw_publish_cpu_ms_client"] = 1000 * (time.process_time() - client_before) / messages
            figures["raw_publish_cpu_ms_broker"] = 1000 * broker.seconds() / messages
            figures["raw_consume_rps"] = await _consume(connection, queue_name, messages)
            latencies = sorted(await _publish_at(channel, queue_name, rate, int(rate * seconds)))
        finally:
            await queue.delete(if_unused=False, if_empty=False)
    figures["raw_publish_p50_ms"] = 1000 * latencies[len(latencies) // 2]
    figures["raw_publish_p99_ms"] = 1000 * latencies[int(len(latencies) * 0.99)]
    return figures


async def _publish_at(channel, queue_name: str, rate: float, messages: int) -> list[float]:
    """Open loop, as the ingress latency phase: latency from each scheduled send."""
    body = b"x" * 1024
    latencies = []

    async def publish_one(scheduled: float) -> None:
        await channel.default_exchange.publish(
            aio_pika.Message(body, delivery_mode=aio_pika.DeliveryMode.PERSISTENT), routing_key=queue_name
        )
        latencies.append(time.perf_counter() - scheduled)

    start, tasks = time.perf_counter() + 0.05, []
    for n in range(messages):
        scheduled = start + n / rate
        if (delay := scheduled - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(publish_one(scheduled)))
    await asyncio.gather(*tasks)
    return latencies


async def _publish(channel, queue_name: str, messages: int) -> float:
    started = time.perf_counter()
    await publish_many(channel, queue_name, messages)
    return messages / (time.perf_counter() - started)


async def publish_many(channel, queue_name: str, messages: int, with_ids: bool = False) -> None:
    """`messages` confirmed persistent 1 KiB publishes, IN_FLIGHT at a time
    (each with a message id of its own when `with_ids`)."""
    body = b"x" * 1024
    slots = asyncio.Semaphore(IN_FLIGHT)

    async def publish_one() -> None:
        async with slots:
            await channel.default_exchange.publish(
                aio_pika.Message(
                    body,
                    message_id=uuid.uuid4().hex if with_ids else None,
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                ),
                routing_key=queue_name,
            )

    await asyncio.gather(*(publish_one() for _ in range(messages)))


async def _consume(connection, queue_name: str, messages: int) -> float:
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=IN_FLIGHT)
    queue = await channel.get_queue(queue_name, ensure=False)
    done = asyncio.get_running_loop().create_future()
    received = 0

    async def on_message(message) -> None:
        nonlocal received
        await message.ack()
        received += 1
        if received == messages and not done.done():
            done.set_result(None)

    started = time.perf_counter()
    tag = await queue.consume(on_message)
    await done
    elapsed = time.perf_counter() - started
    await queue.cancel(tag)
    return messages / elapsed
