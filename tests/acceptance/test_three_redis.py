"""Redlock's quorum with three real Redis masters (docs/reference.md §7, deployment):
one master dies mid-run, the other two still make a majority, and every
event's effect happens once, without falling back to degraded mode."""

import contextlib

import pytest

from tests.support.events import make_event, publish_events
from tests.support.exactly_once import (
    assert_each_once,
    metered_worker,
    until_completed,
    until_every_message_handled,
    write_sources,
)
from tests.support.processes import count_rows
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.usefixtures("effects_tables")


async def test_one_of_three_redis_masters_killed_mid_run_keeps_exactly_once(settings, fleet, tmp_path):
    events = [make_event("acme", f"evt_{n}") for n in range(600)]
    with contextlib.ExitStack() as stack:
        masters = [stack.enter_context(RedisServer()) for _ in range(3)]
        env = {
            "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", "tests.support.handlers:slow_inbox"),
            "REDIS_URLS": ",".join(master.url for master in masters),
        }
        workers = [metered_worker(fleet, env, "--concurrency", "16") for _ in range(2)]
        await publish_events(settings.amqp_url, settings.namespace, [e for e in events for _ in range(2)])

        await until_completed(settings.database_url, 200)
        masters[1].kill()
        assert await count_rows(settings.database_url, "processed_events") < 600  # mid-run
        await until_every_message_handled([url for _, url in workers], 1200)

    await assert_each_once(settings.database_url, events)
    for worker, _ in workers:  # two of three answered: the lock kept working
        assert "idempotency_store_degraded" not in worker.output()
