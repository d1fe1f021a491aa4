"""How many messages a namespace's queues still hold, without the
management plugin: `rabbitmqctl` (ready and unacked, this machine's broker
only) or a passive declare (ready only; exact once no consumer holds any).
"""

import asyncio
import contextlib

import aio_pika

from webhook_ingest.ingress.publisher import probe_queue
from tests.support.broker import ctl_command


async def held_by_rabbitmqctl(namespace: str) -> dict[str, int] | None:
    """Ready + unacked per queue of the namespace; None when rabbitmqctl is unavailable."""
    try:
        listing = await asyncio.create_subprocess_exec(
            *ctl_command(), "-q", "list_queues", "name", "messages_ready", "messages_unacknowledged",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
    except FileNotFoundError:
        return None
    output = (await listing.communicate())[0].decode()
    if listing.returncode != 0:
        return None
    held = {}
    for line in output.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[0].startswith(f"{namespace}.") and fields[1].isdigit() \
                and fields[0] != probe_queue(namespace):
            held[fields[0]] = int(fields[1]) + int(fields[2])
    return held


async def ready_by_passive_declare(amqp_url: str, names: list[str]) -> dict[str, int]:
    """Ready messages per queue; a queue that does not exist is left out."""
    ready = {}
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        for name in names:
            with contextlib.suppress(aio_pika.exceptions.ChannelClosed, aio_pika.exceptions.ChannelNotFoundEntity):
                channel = await connection.channel()
                queue = await channel.declare_queue(name, passive=True)
                ready[name] = queue.declaration_result.message_count
    return ready
