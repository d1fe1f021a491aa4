"""How many messages a namespace's queues still hold, without the
management plugin: `rabbitmqctl` (ready and unacked, this machine's broker
only) or a passive declare (ready only; exact once no consumer holds any).
"""

import asyncio
import contextlib

import aio_pika

from tests.support.broker import ctl_command
from webhook_ingest.ingress.publishing.publisher import probe_queue


async def held_by_rabbitmqctl(namespace: str) -> dict[str, int] | None:
    """Ready + unacked per queue of the namespace; None when rabbitmqctl is unavailable."""
    try:
        listing = await asyncio.create_subprocess_exec(
            *ctl_command(),
            "-q",
            "list_queues",
            "name",
            "messages_ready",
            "messages_unacknowledged",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
    except FileNotFoundError:
        return None
    output = (await listing.communicate())[0].decode()
    if listing.returncode != 0:
        return None
    held = {}
    for line in output.splitlines():
        fields = line.split()
        if (
            len(fields) == 3
            and fields[0].startswith(f"{namespace}.")
            and fields[1].isdigit()
            and fields[0] != probe_queue(namespace)
        ):
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


# What names a message left behind: the pipeline's headers (shared/event/message.py), then the broker's.
_NAMING_HEADERS = (
    "x-attempt",
    "x-arrival",
    "x-route",
    "x-replay-of",
    "x-deliveries",
    "x-delivery-count",
    "x-first-death-queue",
    "x-first-death-reason",
)


async def peek(amqp_url: str, queue: str, limit: int = 5) -> list[tuple[str, str]]:
    """Up to `limit` of the ready messages of `queue`, (key, what its headers
    say), put back: read unacked, and requeued by the channel's close. Only
    once the workers are stopped (the run is judged)."""
    found: list[tuple[str, str]] = []
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        held = await channel.declare_queue(queue, passive=True)
        for _ in range(limit):
            message = await held.get(no_ack=False, fail=False)
            if message is None:
                break
            found.append(described(message.headers or {}, message.expiration, message.message_id))
    return found


def described(headers: dict, expiration: object = None, message_id: str | None = None) -> tuple[str, str]:
    """(key, its headers and the broker's in a line): queue, key, attempt, arrival, deaths."""
    key = _text(headers.get("x-key", "?"))
    parts = [f"{name.removeprefix('x-')} {_text(headers[name])}" for name in _NAMING_HEADERS if name in headers]
    for death in headers.get("x-death") or []:
        parts.append(f"died in {_text(death.get('queue'))} ({_text(death.get('reason'))} x{death.get('count')})")
    if expiration is not None:
        parts.append(f"expiration {expiration}")
    if message_id:
        parts.append(f"message id {message_id}")
    return key, ", ".join(parts)


def _text(value: object) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
