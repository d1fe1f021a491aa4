"""A pause is not a loss (issue 35, finding 1): a worker stopped with
SIGSTOP — what a GC pause, a CPU-throttled container or a VM migration
does — and continued repeats an external call only for a key another
worker really took meanwhile.

Before the fix, one default worker with 200 events of a handler that POSTs
to a downstream answering in 300 ms and then writes through `ctx.db`,
stopped for 2.5 s (under the 3 s TTL) once 40 calls were answered, POSTed
196 keys successfully twice: its own timer gave the leases up on waking,
though Postgres still had them as its own and nobody else could have taken
them."""

import asyncio
import contextlib
import os
import signal

import asyncpg
import orjson
import pytest

from tests.support.events import make_event, publish_events, queue_depth
from tests.support.exactly_once import effects_by_key, until_completed, write_sources
from tests.support.processes import Process, count_rows, wait_for_output, wait_until
from webhook_ingest.shared.broker import topology

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("effects_tables")]

EVENTS = 200
PAUSE = 2.5  # seconds: shorter than the lock TTL (3 s), longer than what is left of a lease at its deadline
# Woken past its runs' deadlines (2 s after their leases were taken, ~0.3 s
# before the pause) but before the limit of an unanswered confirmation (2.5 s).
SHORTER_PAUSE = 1.9
HANDLER = "tests.support.handlers:call_then_record"  # a payment call, then a write through ctx.db


@contextlib.asynccontextmanager
async def stopped(worker: Process):
    """The worker's process stopped (SIGSTOP) while the block runs, continued after."""
    os.kill(worker.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(worker.pid, signal.SIGCONT)


async def drained(settings) -> bool:
    queues = [topology.events_queue(settings.namespace), topology.retry_queue(settings.namespace, 1.0)]
    return all([await queue_depth(settings.amqp_url, name) == 0 for name in queues])


async def test_a_pause_shorter_than_the_ttl_repeats_no_call(settings, fleet, tmp_path, downstream):
    await _paused_once_repeats_no_call(settings, fleet, tmp_path, downstream, PAUSE)


async def test_a_pause_ending_just_before_the_confirmation_limit_repeats_no_call(settings, fleet, tmp_path, downstream):
    """Woken between its deadline (2 s after its lease was taken) and the
    limit of an unanswered confirmation (2.5 s), a run's keeper asks with
    little left until that limit, on a loop busy with every run that woke
    with it: an answer come back but not yet run is no black hole."""
    await _paused_once_repeats_no_call(settings, fleet, tmp_path, downstream, SHORTER_PAUSE)


async def _paused_once_repeats_no_call(settings, fleet, tmp_path, downstream, pause: float) -> None:
    sources = write_sources(tmp_path / "s.toml", HANDLER, url=downstream.url)
    events = [make_event("acme", f"evt_{n}") for n in range(EVENTS)]
    await publish_events(settings.amqp_url, settings.namespace, events)  # a backlog
    worker = fleet.worker(env={"WEBHOOK_INGEST_SOURCES": sources})  # the defaults: TTL 3 s, 256 in flight

    async def forty_answered() -> bool:
        return sum(downstream.answered.values()) >= 40

    await wait_until(forty_answered, 60, interval=0.01, message="40 calls answered")
    async with stopped(worker):
        await asyncio.sleep(pause)
    await until_completed(settings.database_url, EVENTS, timeout=60)
    await wait_until(lambda: drained(settings), 30, message="empty events and deferral queues")
    await asyncio.sleep(1.5)  # a deferral would be back from the 1 s queue by now

    assert downstream.answered == {event.key: 1 for event in events}  # each called successfully once
    assert await effects_by_key(settings.database_url) == {event.key: 1 for event in events}
    assert await count_rows(settings.database_url, "processed_events") == EVENTS
    assert "lease_lost_handler_cancelled" not in worker.output()


async def test_a_key_taken_during_a_pause_is_completed_once_by_its_taker(settings, fleet, tmp_path, downstream):
    """The allowed repeat: paused past its lease, the first worker's key is
    taken by a second worker, which runs a copy of the event and completes
    it. Continued, the first must not complete: the key's fencing token is
    no longer its own."""
    sources = write_sources(tmp_path / "s.toml", HANDLER, url=downstream.url + "?latency=1")
    env = {"WEBHOOK_INGEST_SOURCES": sources}
    event = make_event("acme", "evt_taken")
    first = fleet.worker("--concurrency", "1", env=env)  # its one message in flight: the copy goes elsewhere
    await wait_for_output(first, "worker_consuming")
    await publish_events(settings.amqp_url, settings.namespace, [event])

    async def called() -> bool:
        return downstream.posts[event.key] == 1

    await wait_until(called, 30, interval=0.01, message="the first worker's call")
    async with stopped(first):
        second = fleet.worker(env=env)
        await wait_for_output(second, "worker_consuming")
        await publish_events(settings.amqp_url, settings.namespace, [event])  # a copy
        await until_completed(settings.database_url, 1, timeout=60)  # once the paused lease ran out
    await wait_until(lambda: _settled(first, event.key), 30, message="the first worker's message settled")

    assert await effects_by_key(settings.database_url) == {event.key: 1}
    assert await _effect_pids(settings.database_url) == [second.pid]  # the taker's run, not the paused one's
    assert await count_rows(settings.database_url, "processed_events") == 1
    assert downstream.answered == {event.key: 2}  # the paused call and the taker's: the repeat a takeover costs


async def _settled(worker: Process, key: str) -> str:
    for line in worker.output().splitlines():
        if '"event_processed"' in line and (record := orjson.loads(line)).get("key") == key:
            return record["outcome"]
    return ""


async def _effect_pids(database_url: str) -> list[int]:
    connection = await asyncpg.connect(database_url)
    try:
        return [row["pid"] for row in await connection.fetch("SELECT pid FROM effects")]
    finally:
        await connection.close()
