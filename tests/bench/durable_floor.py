"""The least work a durable exactly-once-effect pipeline on RabbitMQ and
Postgres must do (issue 24): the yardstick our end-to-end figures are
compared with, as the raw pipeline is the broker's alone.

One publisher with confirms (this process, 256 in flight, persistent 1 KiB
messages with an id) and, at the same time, one consumer process (prefetch
256) that commits one row per message — `INSERT … ON CONFLICT DO NOTHING`
on the message id, `synchronous_commit` on, every message that arrived
while the previous commit ran in the next one (as our workers batch) —
and then acks them with one `multiple` ack. Nothing else: no HTTP, no
signature, no lock, no lease. `durable_floor_rps` runs from the first
publish to the last ack; CPU per message is every process's: both
clients, the broker, and the Postgres backends of the bench's database.

`python -m tests.bench.durable_floor URL QUEUE DATABASE_URL N` is the
consumer: it prints `ready`, then, after N messages, the wall-clock time
of its last ack.
"""

import asyncio
import os
import sys
import time

import aio_pika
import asyncpg

from tests.bench.cpu import CpuMeter
from tests.bench.raw_broker import IN_FLIGHT, publish_many

TABLE = "CREATE TABLE IF NOT EXISTS durable_floor (id text PRIMARY KEY)"
INSERT = "INSERT INTO durable_floor (id) SELECT unnest($1::text[]) ON CONFLICT DO NOTHING"


async def measure(
    amqp_url: str, queue_name: str, database_url: str, database: str, redis_port: int, messages: int
) -> dict[str, float]:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(queue_name, durable=True, arguments={"x-queue-type": "quorum"})
        consumer = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.bench.durable_floor",
            amqp_url,
            queue_name,
            database_url,
            str(messages),
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert consumer.stdout is not None
            assert (await consumer.stdout.readline()).strip() == b"ready"
            meter = CpuMeter({"clients": [os.getpid(), consumer.pid]}, database, redis_port)
            await meter.measure_background()
            meter.start()
            started = time.time()
            await publish_many(channel, queue_name, messages, with_ids=True)
            last_ack = float((await consumer.stdout.readline()).strip())
            cpu = meter.stop()
            await consumer.wait()
        finally:
            if consumer.returncode is None:
                consumer.kill()
            await queue.delete(if_unused=False, if_empty=False)
    figures = {
        "durable_floor_rps": messages / (last_ack - started),
        "durable_floor_cpu_ms": 1000 * sum(cpu.values()) / messages,
    }
    for name, seconds in cpu.items():
        figures[f"durable_floor_cpu_ms_{name.split('.')[0].replace('-', '_')}"] = 1000 * seconds / messages
    return figures


async def consume(amqp_url: str, queue_name: str, database_url: str, messages: int) -> None:
    database = await asyncpg.connect(database_url)
    await database.execute(TABLE)
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=IN_FLIGHT)
        queue = await channel.get_queue(queue_name, ensure=False)
        arrived: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
        await queue.consume(arrived.put)  # type: ignore[arg-type]
        print("ready", flush=True)
        committed = 0
        while committed < messages:
            batch = [await arrived.get()]
            while not arrived.empty():
                batch.append(arrived.get_nowait())
            await database.execute(INSERT, [message.message_id for message in batch])
            await batch[-1].ack(multiple=True)  # one writer: every earlier delivery is committed too
            committed += len(batch)
        print(time.time(), flush=True)
    await database.close()


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(consume(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
