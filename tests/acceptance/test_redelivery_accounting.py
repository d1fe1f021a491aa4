"""The counters and the dead-letter list tell the truth after a worker died
between its commit and its ack (issue 10, "Metrics drift").

The crash is reproduced exactly where it matters: a consumer takes the
message without acking it, the completion (or the dead letter) is committed
under that message's id as the dying worker would have, and the consumer's
channel closes, so the broker redelivers the message to a real worker.
"""

import aio_pika
import aiohttp
import asyncpg
import pytest

from tests.support.events import make_event, publish_events
from tests.support.exactly_once import effects_by_key, metered_worker, until_every_message_handled, write_sources
from tests.support.processes import count_rows, outcomes, wait_until
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.dead_letters.model import record_dead_letter

pytestmark = pytest.mark.usefixtures("effects_tables")


async def _take_without_ack(settings) -> aio_pika.abc.AbstractIncomingMessage:
    connection = await aio_pika.connect(settings.amqp_url)
    channel = await connection.channel()
    queue = await channel.get_queue(topology.events_queue(settings.namespace), ensure=False)
    message = await queue.get(no_ack=False, timeout=10)
    return connection, message


async def test_a_completion_whose_ack_died_is_counted_processed_not_duplicate(settings, fleet, tmp_path):
    event = make_event("acme", "evt_acked_never")
    await publish_events(settings.amqp_url, settings.namespace, [event])
    connection, message = await _take_without_ack(settings)
    database = await asyncpg.connect(settings.database_url)
    try:  # what the dying worker committed
        await database.execute(
            "INSERT INTO processed_events (key, source, event_id, payload_sha256, fencing_token, attempts, message_id)"
            " VALUES ($1, 'acme', $2, $3, 1, 1, $4)",
            event.key,
            event.event_id,
            event.payload_sha256,
            message.message_id,
        )
    finally:
        await database.close()
    await connection.close()  # the worker is gone: the broker redelivers

    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", "tests.support.handlers:counted_inbox")}
    _, metrics_url = metered_worker(fleet, env)
    await until_every_message_handled([metrics_url], 1)
    assert await outcomes([metrics_url]) == {"processed": 1.0}
    assert await effects_by_key(settings.database_url) == {}  # not run again


async def test_a_dead_letter_whose_ack_died_is_not_run_again_nor_recorded_twice(settings, fleet, tmp_path):
    event = make_event("acme", "evt_dead_unacked")
    await publish_events(settings.amqp_url, settings.namespace, [event])
    connection, _message = await _take_without_ack(settings)
    database = await asyncpg.connect(settings.database_url)
    try:
        await record_dead_letter(database, event, [{"attempt": 3, "type": "RuntimeError", "message": "boom"}])
    finally:
        await database.close()
    await connection.close()

    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", "tests.support.handlers:counted_inbox")}
    _, metrics_url = metered_worker(fleet, env)

    async def settled() -> bool:
        try:
            return (await outcomes([metrics_url])).get("dead") == 1
        except aiohttp.ClientConnectionError:  # the worker still starting
            return False

    await wait_until(settled, 60, message="the redelivery settled as dead")
    assert await count_rows(settings.database_url, "dead_letters") == 1
    assert await count_rows(settings.database_url, "processed_events") == 0
    assert await effects_by_key(settings.database_url) == {}
