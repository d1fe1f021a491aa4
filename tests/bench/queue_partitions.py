"""Where one quorum queue saturates, and what N of them give (`--phase
partitions`, alone only; `--queues 1,2,4`).

A quorum queue's leader is one Erlang process: every publish, confirm,
delivery and ack of the queue goes through it, on one scheduler at a time,
so one queue cannot use more than one core of its node whatever the number
of clients. For each count N: N quorum queues, then CLIENTS processes at
once, each publishing confirmed persistent 1 KiB messages round robin over
the N queues (IN_FLIGHT unconfirmed at a time) and consuming every queue
(prefetch IN_FLIGHT, an ack each), for SECONDS. Reported per N: messages
consumed per second, and the broker's CPU (every `beam.smp` on the machine,
as tests/bench/cpu.py) in cores and in ms a message. When the rate stops
growing while the broker has a core to spare, one queue's leader is the
bound; when the broker's cores reach the machine's, the machine is."""

import asyncio
import multiprocessing
import os
import sys
import time
import uuid

import aio_pika

from tests.bench.cpu import BrokerCpu, cpu_seconds

AMQP_URL = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
IN_FLIGHT = 256
CLIENTS = 2
SECONDS = 10.0
BODY = b"x" * 1024


async def _client(amqp_url: str, queues: list[str], seconds: float, offset: int) -> tuple[int, int]:
    """Publishes and consumes for `seconds`; (published, consumed)."""
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        publishing = await connection.channel(publisher_confirms=True)
        consuming = await connection.channel()
        await consuming.set_qos(prefetch_count=IN_FLIGHT)
        consumed = 0

        async def on_message(message) -> None:
            nonlocal consumed
            await message.ack()
            consumed += 1

        for name in queues:
            queue = await consuming.get_queue(name, ensure=False)
            await queue.consume(on_message)
        deadline = time.perf_counter() + seconds
        published = 0

        async def publisher(lane: int) -> None:
            nonlocal published
            n = lane
            while time.perf_counter() < deadline:
                message = aio_pika.Message(
                    BODY, message_id=uuid.uuid4().hex, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
                )
                await publishing.default_exchange.publish(message, routing_key=queues[(n + offset) % len(queues)])
                published += 1
                n += 1

        counted_from = consumed
        await asyncio.gather(*(publisher(lane) for lane in range(IN_FLIGHT)))
        return published, consumed - counted_from


def _run_client(amqp_url: str, queues: list[str], seconds: float, offset: int, results) -> None:
    results.put(asyncio.run(_client(amqp_url, queues, seconds, offset)))


async def _declare(amqp_url: str, queues: list[str], delete: bool) -> None:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        for name in queues:
            if delete:
                await channel.queue_delete(name)
            else:
                await channel.declare_queue(name, durable=True, arguments={"x-queue-type": "quorum"})


def measure(amqp_url: str, count: int, seconds: float = SECONDS) -> dict[str, float]:
    queues = [f"bench.partitions.{os.getpid()}.{n}" for n in range(count)]
    asyncio.run(_declare(amqp_url, queues, delete=False))
    try:
        results: multiprocessing.Queue = multiprocessing.Queue()
        processes = [
            multiprocessing.Process(target=_run_client, args=(amqp_url, queues, seconds, n, results))
            for n in range(CLIENTS)
        ]
        broker, started = BrokerCpu(), time.perf_counter()
        for process in processes:
            process.start()
        pids = [process.pid for process in processes if process.pid]
        outcomes = [results.get(timeout=seconds + 60) for _ in processes]
        clients_cpu = sum(cpu_seconds(pid) for pid in pids)  # before they exit
        for process in processes:
            process.join()
        elapsed, broker_seconds = time.perf_counter() - started, broker.seconds()
    finally:
        asyncio.run(_declare(amqp_url, queues, delete=True))
    consumed = sum(c for _, c in outcomes)
    return {
        "queues": count,
        "published_per_s": round(sum(p for p, _ in outcomes) / elapsed),
        "consumed_per_s": round(consumed / elapsed),
        "broker_cores": round(broker_seconds / elapsed, 2),
        "broker_cpu_ms_per_message": round(1000 * broker_seconds / max(consumed, 1), 3),
        "clients_cores": round(clients_cpu / elapsed, 2),
    }


def main(counts: list[int]) -> int:
    print(f"load average before: {os.getloadavg()}", file=sys.stderr)
    rows = [measure(AMQP_URL, count) for count in counts]
    print("| queues | published/s | consumed/s | broker cores | broker ms/message | clients cores |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['queues']} | {row['published_per_s']:,} | {row['consumed_per_s']:,} | "
            f"{row['broker_cores']} | {row['broker_cpu_ms_per_message']} | {row['clients_cores']} |"
        )
    print(f"load average after: {os.getloadavg()}", file=sys.stderr)
    import json

    print(json.dumps({"partitions": rows}))
    return 0
