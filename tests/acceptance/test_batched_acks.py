"""Batched acks (`workers.acks`) with real worker processes and RabbitMQ: a
batch's one `multiple` ack never settles a delivery that is still being
worked on, and nothing is lost or run twice when a worker is killed or its
connection to the broker is cut while batches are acked that way."""

import asyncio

import pytest

from tests.support.broker import amqp_port
from tests.support.events import make_event, publish_events, queue_depth
from tests.support.exactly_once import (
    assert_each_once,
    effects_by_key,
    metered_worker,
    until_completed,
    until_every_message_handled,
)
from tests.support.processes import count_rows, wait_until
from tests.support.tcpproxy import TcpProxy
from webhook_ingest.shared.broker import topology

pytestmark = pytest.mark.usefixtures("effects_tables")
HANDLERS = "tests.support.handlers"


def write_sources(path, database_url: str) -> str:
    """`acme`: a batchable counting inbox; `held`: a first run that never ends."""
    path.write_text(
        '[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["s"]\n'
        f'handler = "{HANDLERS}:counted_inbox"\n'
        '[sources.held]\nscheme = "hmac-sha256"\nsecrets = ["s"]\n'
        f'handler = "{HANDLERS}:holds_its_first_run"\n'
        f'handler_options = {{ database_url = "{database_url}" }}\n'
    )
    return str(path)


async def test_batches_acked_above_a_delivery_in_its_handler_and_its_waiting_copy_leave_both_to_the_broker(
    settings, fleet, tmp_path
):
    """The first two deliveries of the channel are an event whose handler
    does not end and its copy, waiting for it in memory; 300 events behind
    them complete in batches and are acked. When the worker is SIGKILLed,
    both deliveries must still be the broker's: a batch's `multiple` ack
    that covered them would have lost the event."""
    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", settings.database_url)}
    held = make_event("held", "evt_held")
    events = [make_event("acme", f"evt_{n}") for n in range(300)]
    await publish_events(settings.amqp_url, settings.namespace, [held, held, *events])
    worker, metrics_url = metered_worker(fleet, env, "--concurrency", "64")

    # acked, not only committed: a batch killed between its commit and its ack would come back too
    await until_every_message_handled([metrics_url], len(events))
    assert await count_rows(settings.database_url, "runs_started") == 1  # the held run is in its handler
    worker.kill()
    await wait_until(lambda: _queue_depth_is(settings, 2), 30, message="the held event and its copy back in the queue")

    fleet.worker("--concurrency", "64", env=env)
    await until_completed(settings.database_url, len(events) + 1)
    await wait_until(lambda: _queue_depth_is(settings, 0), 30, message="an empty queue")
    await assert_each_once(settings.database_url, [held, *events])


async def test_a_worker_killed_while_acking_batches_loses_nothing_and_repeats_nothing(settings, fleet, tmp_path):
    """Two workers drain 4,000 events in batches; one is SIGKILLed a quarter
    of the way through, a replacement starts: every event once."""
    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", settings.database_url)}
    events = [make_event("acme", f"evt_{n}") for n in range(4000)]
    await publish_events(settings.amqp_url, settings.namespace, events)
    victim = fleet.worker("--concurrency", "64", env=env)
    fleet.worker("--concurrency", "64", env=env)

    await until_completed(settings.database_url, 1000)
    victim.kill()
    assert await count_rows(settings.database_url, "processed_events") < len(events)  # killed mid-run
    fleet.worker("--concurrency", "64", env=env)

    await until_completed(settings.database_url, len(events))
    await wait_until(lambda: _queue_depth_is(settings, 0), 30, message="an empty queue")
    await asyncio.sleep(1)  # a redelivered copy of the victim's messages would show by now
    await assert_each_once(settings.database_url, events)


async def test_a_connection_cut_while_acking_batches_then_new_delivery_tags_on_a_new_channel(settings, fleet, tmp_path):
    """The worker's connection to RabbitMQ is cut mid-run (its acks on the
    old channel fail; everything unacked comes back) and reopened: the new
    channel counts delivery tags from 1 again, and its batches' acks must
    not be confused with the old channel's. An event whose handler does not
    end is delivered first on the old channel and again on the new one."""
    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", settings.database_url)}
    held = make_event("held", "evt_held")
    events = [make_event("acme", f"evt_{n}") for n in range(3000)]
    with TcpProxy("127.0.0.1", amqp_port()) as broker:
        worker = fleet.worker("--concurrency", "64", env={**env, "AMQP_URL": broker.url_for(settings.amqp_url)})
        await publish_events(settings.amqp_url, settings.namespace, [held, *events])
        await until_completed(settings.database_url, 500)
        broker.cut()
        await asyncio.sleep(1)
        broker.restore()
        await until_completed(settings.database_url, len(events))
        worker.kill()

    assert await count_rows(settings.database_url, "runs_started") == 1
    fleet.worker("--concurrency", "64", env=env)  # the held event, from wherever it waits
    await until_completed(settings.database_url, len(events) + 1)
    await wait_until(lambda: _queue_depth_is(settings, 0), 30, message="an empty queue")
    await asyncio.sleep(1)
    await assert_each_once(settings.database_url, [held, *events])
    assert (await effects_by_key(settings.database_url))[held.key] == 1


async def _queue_depth_is(settings, depth: int) -> bool:
    return await queue_depth(settings.amqp_url, topology.events_queue(settings.namespace)) == depth
