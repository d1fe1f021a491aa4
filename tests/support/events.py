"""Putting events on the queue as the ingress would, without HTTP."""

import asyncio
import time

import aio_pika
import orjson

from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.event import ids as event_id
from webhook_ingest.shared.event.message import EventMessage, to_amqp


def make_event(source: str, event_key_id: str, extra: dict | None = None) -> EventMessage:
    payload = {"id": event_key_id, "type": "test.event", **(extra or {})}
    body = orjson.dumps(payload)
    return EventMessage(
        key=event_id.idempotency_key(source, event_key_id),
        source=source,
        event_id=event_key_id,
        payload_sha256=event_id.payload_sha256(payload),
        received_at=time.time(),
        body=body,
        headers={"content-type": "application/json"},
    )


async def publish_events(amqp_url: str, namespace: str, events, delivery_limit: int = 20) -> None:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        await topology.declare_events_queue(channel, namespace, delivery_limit)
        queue_name = topology.events_queue(namespace)
        events = list(events)
        for start in range(0, len(events), 200):  # many confirms in flight, as the ingress has
            batch = events[start : start + 200]
            await asyncio.gather(*(topology.publish(channel, to_amqp(e), queue_name) for e in batch))


async def queue_depth(amqp_url: str, queue_name: str) -> int:
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(queue_name, passive=True)
        return queue.declaration_result.message_count
