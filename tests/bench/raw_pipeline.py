"""The broker's own end-to-end limit: one publisher with confirms and one
consumer acking each message, at the same time, on one quorum queue, in two
processes (as the ingress and a worker are). `raw_pipeline_rps` runs from
the first publish to the last ack.

`python -m tests.bench.raw_pipeline URL QUEUE N` is the consumer: it prints
`ready`, then, after N messages, the wall-clock time of its last ack and
its own CPU seconds. CPU per message of the broker and of both clients is
reported too: what a message costs end to end with nothing of ours."""

import asyncio
import sys
import time

import aio_pika

from tests.bench.cpu import BrokerCpu
from tests.bench.raw_broker import IN_FLIGHT, publish_many


async def measure(amqp_url: str, queue_name: str, messages: int) -> dict[str, float]:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(queue_name, durable=True, arguments={"x-queue-type": "quorum"})
        consumer = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.bench.raw_pipeline",
            amqp_url,
            queue_name,
            str(messages),
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert (await consumer.stdout.readline()).strip() == b"ready"
            started, publisher_before, broker = time.time(), time.process_time(), BrokerCpu()
            await publish_many(channel, queue_name, messages)
            publisher_cpu = time.process_time() - publisher_before
            last_ack, consumer_cpu = map(float, (await consumer.stdout.readline()).split())
            broker_cpu = broker.seconds()
            await consumer.wait()
        finally:
            if consumer.returncode is None:
                consumer.kill()
            await queue.delete(if_unused=False, if_empty=False)
    return {
        "raw_pipeline_rps": messages / (last_ack - started),
        "raw_pipeline_cpu_ms_broker": 1000 * broker_cpu / messages,
        "raw_pipeline_cpu_ms_clients": 1000 * (publisher_cpu + consumer_cpu) / messages,
    }


async def consume(amqp_url: str, queue_name: str, messages: int) -> None:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
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
                done.set_result(time.time())

        await queue.consume(on_message)
        print("ready", flush=True)
        cpu_before = time.process_time()
        last_ack = await done
        print(last_ack, time.process_time() - cpu_before, flush=True)


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(consume(sys.argv[1], sys.argv[2], int(sys.argv[3])))
