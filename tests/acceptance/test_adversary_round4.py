"""Adversary, round 4: edges the first three rounds did not name, read from
the code as an attacker would and checked against real worker processes and
the real services. A test marked xfail(strict) is a finding not fixed yet:
it fails on purpose, and the suite says so once it passes.
"""

import pytest

from tests.support.events import make_event, publish_events
from tests.support.exactly_once import recorded_runs, write_sources
from tests.support.processes import count_rows, wait_for_output, wait_until

pytestmark = pytest.mark.usefixtures("effects_tables")
ADVERSARY = "tests.support.adversary_handlers"


async def test_a_handler_that_raises_cancelled_error_is_retried_not_stuck(settings, fleet, tmp_path):
    """Finding C1. A handler awaits a future that another task cancelled (a
    shared in-flight call whose owner gave up: request-coalescing clients
    do this), so `CancelledError` reaches it although its own task was
    never cancelled. §7: any exception but PermanentError is retried. The
    worker let it through as if it were being shut down: the message was
    neither acked nor sent on, its leader entry never settled — held for
    the worker's lifetime, its copies waiting behind it, its slot lost."""
    sources = write_sources(tmp_path / "s.toml", f"{ADVERSARY}:cancelled_by_a_library_once",
                            database_url=settings.database_url)
    worker = fleet.worker("--concurrency", "2", env={"WEBHOOK_INGEST_SOURCES": sources})
    await wait_for_output(worker, "worker_consuming")
    event = make_event("acme", "evt_cancelled_inside")
    await publish_events(settings.amqp_url, settings.namespace, [event])
    await wait_until(lambda: count_rows(settings.database_url, "processed_events"), 10,
                     message="the completion of attempt 2")
    attempts = sorted(run["started"] for run in await recorded_runs(settings.database_url))
    assert attempts == [1.0, 2.0]
    assert await count_rows(settings.database_url, "effects") == 1
