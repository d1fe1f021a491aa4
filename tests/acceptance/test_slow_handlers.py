"""Real handlers wait on the network (issue 20): at the `run` defaults (two
workers, 256 messages in flight each), with a backlog waiting when the
workers start and nothing failing, every event runs its handler exactly
once and none is lost — for a handler that only calls a downstream
answering in 300 ms (the built-in `forward`), and for one that calls it and
then writes through `ctx.db`.

Before the fix, the first lost 96 of 300 events and POSTed 84 keys twice:
runs waited for one of 20 pooled connections while their Redis lock's
validity ran out (LockLost, deferred, run again), and a deferral came back
while its leader was still registered and was acked as its copy."""

import asyncio

from tests.support.events import make_event, publish_events, queue_depth
from tests.support.exactly_once import effects_by_key, until_completed, write_sources
from tests.support.processes import count_rows, wait_for_output, wait_until
from tests.support.tcpproxy import TcpProxy
from webhook_ingest.shared.broker import topology

EVENTS = 300


async def _run_backlog_through_two_default_workers(settings, fleet, sources: str, database_url: str = "") -> list:
    events = [make_event("acme", f"evt_{n}") for n in range(EVENTS)]
    await publish_events(settings.amqp_url, settings.namespace, events)  # a backlog, as after a deploy
    env = {"WEBHOOK_INGEST_SOURCES": sources, **({"DATABASE_URL": database_url} if database_url else {})}
    workers = [fleet.worker(env=env) for _ in range(2)]  # no --concurrency: 256
    await until_completed(settings.database_url, EVENTS, timeout=60)
    queues = [topology.events_queue(settings.namespace), topology.retry_queue(settings.namespace, 1.0)]

    async def drained() -> bool:
        return all([await queue_depth(settings.amqp_url, name) == 0 for name in queues])

    await wait_until(drained, 30, message="empty events and deferral queues")
    await asyncio.sleep(1.5)  # a deferral would be back from the 1 s queue by now
    for worker in workers:
        await wait_for_output(worker, "worker_consuming")
        assert "LockLost" not in worker.output() and "event_deferred" not in worker.output()
    return events


async def test_a_slow_network_handler_runs_once_per_event_and_loses_none(settings, fleet, tmp_path, downstream):
    url, posts = downstream.url, downstream.posts
    sources = write_sources(tmp_path / "s.toml", "forward", url=url)
    events = await _run_backlog_through_two_default_workers(settings, fleet, sources)

    assert posts == {event.key: 1 for event in events}  # each POSTed once, none missing
    assert await count_rows(settings.database_url, "processed_events") == EVENTS
    assert await count_rows(settings.database_url, "dead_letters") == 0


async def test_a_worker_calls_the_downstream_for_every_message_in_flight(settings, fleet, tmp_path, downstream):
    """aiohttp's default of 100 connections per session made the 101st
    `forward` of a worker wait for one: two workers had at most 200 calls in
    flight, whatever their concurrency."""
    url, posts = downstream.url, downstream.posts
    sources = write_sources(tmp_path / "s.toml", "forward", url=url + "?latency=3")
    events = await _run_backlog_through_two_default_workers(settings, fleet, sources)

    assert posts == {event.key: 1 for event in events}
    assert downstream.peak > 200


async def test_a_slow_handler_that_writes_through_ctx_db_runs_once_and_commits_once(
    settings, fleet, tmp_path, downstream, effects_tables
):
    url, posts = downstream.url, downstream.posts
    sources = write_sources(tmp_path / "s.toml", "tests.support.handlers:call_then_record", url=url)
    events = await _run_backlog_through_two_default_workers(settings, fleet, sources)

    assert posts == {event.key: 1 for event in events}  # one run each
    assert await effects_by_key(settings.database_url) == {event.key: 1 for event in events}
    assert await count_rows(settings.database_url, "processed_events") == EVENTS
    assert await count_rows(settings.database_url, "dead_letters") == 0


async def test_a_ctx_db_handler_keeps_its_lease_when_postgres_is_a_round_trip_away(
    settings, fleet, tmp_path, downstream, effects_tables
):
    """Postgres 20 ms away (another zone) and a downstream that takes 3 s:
    each worker's ~150 runs renew their leases together every second, which
    one statement each on two connections cannot do in time (they queued
    past their deadlines and runs ended LockLost, deferred, ran again);
    renewed together (workers/claim/renewals.py), they keep their leases."""
    url, posts = downstream.url, downstream.posts
    sources = write_sources(tmp_path / "s.toml", "tests.support.handlers:call_then_record", url=url + "?latency=3")
    with TcpProxy("127.0.0.1", 5432, latency=0.02) as postgres:
        events = await _run_backlog_through_two_default_workers(
            settings, fleet, sources, postgres.url_for(settings.database_url)
        )

    assert posts == {event.key: 1 for event in events}
    assert await effects_by_key(settings.database_url) == {event.key: 1 for event in events}
    assert await count_rows(settings.database_url, "processed_events") == EVENTS
