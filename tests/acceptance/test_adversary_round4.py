"""Adversary, round 4: edges the first three rounds did not name, read from
the code as an attacker would and checked against real worker processes and
the real services. A test marked xfail(strict) is a finding not fixed yet:
it fails on purpose, and the suite says so once it passes.
"""

import asyncio

import pytest

from tests.support.events import make_event, publish_events, queue_depth
from tests.support.exactly_once import recorded_runs, write_sources
from tests.support.processes import count_rows, wait_for_output, wait_until
from webhook_ingest.shared.broker import topology

pytestmark = pytest.mark.usefixtures("effects_tables")
ADVERSARY = "tests.support.adversary_handlers"


async def _queue_empty(settings) -> bool:
    return await queue_depth(settings.amqp_url, topology.events_queue(settings.namespace)) == 0


async def test_a_handler_that_raises_cancelled_error_is_retried_not_stuck(settings, fleet, tmp_path):
    """Finding C1. A handler awaits a future that another task cancelled (a
    shared in-flight call whose owner gave up: request-coalescing clients
    do this), so `CancelledError` reaches it although its own task was
    never cancelled. §7: any exception but PermanentError is retried. The
    worker let it through as if it were being shut down: the message was
    neither acked nor sent on, its leader entry never settled — held for
    the worker's lifetime, its copies waiting behind it, its slot lost."""
    sources = write_sources(
        tmp_path / "s.toml", f"{ADVERSARY}:cancelled_by_a_library_once", database_url=settings.database_url
    )
    worker = fleet.worker("--concurrency", "2", env={"WEBHOOK_INGEST_SOURCES": sources})
    await wait_for_output(worker, "worker_consuming")
    event = make_event("acme", "evt_cancelled_inside")
    await publish_events(settings.amqp_url, settings.namespace, [event])
    await wait_until(
        lambda: count_rows(settings.database_url, "processed_events"), 10, message="the completion of attempt 2"
    )
    attempts = sorted(run["started"] for run in await recorded_runs(settings.database_url))
    assert attempts == [1.0, 2.0]
    assert await count_rows(settings.database_url, "effects") == 1


class _Restarting:
    """Workers that a supervisor (systemd, Kubernetes) starts again when they die."""

    def __init__(self, fleet, env: dict, count: int = 1):
        self._fleet, self._env = fleet, env
        self.workers = [self._start() for _ in range(count)]
        self.restarts = 0

    def _start(self):
        return self._fleet.worker("--concurrency", "1", env=self._env)

    def tend(self) -> None:
        for index, worker in enumerate(self.workers):
            if worker.popen.poll() is not None:
                self.workers[index] = self._start()
                self.restarts += 1

    async def until(self, predicate, timeout: float, message: str) -> None:
        async def tended() -> bool:
            self.tend()
            return await predicate()

        await wait_until(tended, timeout, interval=0.1, message=message)


async def test_a_resend_of_an_event_dead_lettered_as_poison_does_not_run_it_again(settings, fleet, tmp_path):
    """Finding C4. An event kills every worker that runs it (a segfault, the
    OOM killer); the delivery limit stops it and the drainer records it as
    an open dead letter (DeliveryLimitExceeded). The provider, which never
    got its effect, sends the event again — Stripe retries for three days.
    §8: "a copy of an event that is an open dead letter is a duplicate until
    on-call replays it", and one poison event never blocks the others. The
    resend ran the handler again and took a worker down again (and again,
    up to the delivery limit, at every resend), each crash also counting a
    delivery against every other message the dead worker held."""
    sources = write_sources(
        tmp_path / "s.toml", f"{ADVERSARY}:kills_its_worker_recorded", database_url=settings.database_url
    )
    env = {"WEBHOOK_INGEST_SOURCES": sources, "WEBHOOK_INGEST_DELIVERY_LIMIT": "1", "WEBHOOK_INGEST_LOCK_TTL": "1"}
    event = make_event("acme", "evt_poison_resent")
    await publish_events(settings.amqp_url, settings.namespace, [event], delivery_limit=1)
    workers = _Restarting(fleet, env)
    await workers.until(lambda: count_rows(settings.database_url, "dead_letters"), 60, "the poison dead letter")
    runs_before = await count_rows(settings.database_url, "runs")

    await publish_events(settings.amqp_url, settings.namespace, [event], delivery_limit=1)  # the provider's resend
    await workers.until(lambda: _queue_empty(settings), 30, "the resend settled")
    await asyncio.sleep(1.5)  # a crash on it shows as a row in runs and a restart
    workers.tend()
    assert await count_rows(settings.database_url, "runs") == runs_before, workers.restarts
    assert await count_rows(settings.database_url, "dead_letters", "status = 'dead'") == 1


async def test_a_worker_started_with_another_delivery_limit_still_consumes(settings, fleet, tmp_path):
    """Finding C5. operations.md: the delivery limit "is an argument of the
    events queue, fixed when the queue is first created … a value changed
    later does not change an existing queue (the ingress and `dlq replay`
    use the queue as it is)". An operator lowers WEBHOOK_INGEST_DELIVERY_LIMIT
    as operations.md suggests for a poison event, and rolls the workers:
    each redeclares the events queue with the new argument, the broker
    refuses (PRECONDITION_FAILED), and no worker starts — every event waits."""
    sources = write_sources(tmp_path / "s.toml", "tests.support.handlers:counted_inbox")
    event = make_event("acme", "evt_after_the_limit_changed")
    await publish_events(settings.amqp_url, settings.namespace, [event], delivery_limit=settings.delivery_limit)
    worker = fleet.worker(
        "--concurrency",
        "2",
        env={"WEBHOOK_INGEST_SOURCES": sources, "WEBHOOK_INGEST_DELIVERY_LIMIT": str(settings.delivery_limit - 15)},
    )
    await wait_until(
        lambda: count_rows(settings.database_url, "processed_events"),
        10,
        message=f"the event processed (worker exited: {worker.popen.poll()})",
    )


async def test_a_run_whose_postgres_session_ended_unseen_goes_on_with_a_new_one(settings, fleet, tmp_path):
    """Finding C6. A failover that drops the old primary's traffic (as RDS
    Multi-AZ does), or a partition that outlasts the server's keepalives:
    the statement a worker had just sent is never answered, and no FIN or
    RST ever arrives. §7.4: with Postgres unreachable, work waits and
    resumes by itself when it returns. A run's statements inside its
    handler's transaction are bounded by the lease timer (07141b4), but
    the one before it — taking the key's lease — and the worker's other
    own statements have no limit: the run waits for ever on the dead
    session, its message held, though Postgres answers new sessions."""
    from tests.support.tcpproxy import TcpProxy

    sources = write_sources(tmp_path / "s.toml", "tests.support.handlers:counted_inbox")
    event = make_event("acme", "evt_sent_into_the_failover")
    with TcpProxy("127.0.0.1", 5432) as postgres:
        worker = fleet.worker(
            "--concurrency",
            "2",
            env={"WEBHOOK_INGEST_SOURCES": sources, "DATABASE_URL": postgres.url_for(settings.database_url)},
        )
        await wait_for_output(worker, "worker_consuming")
        postgres.stall()  # the old primary drops everything
        await publish_events(settings.amqp_url, settings.namespace, [event])
        await asyncio.sleep(0.5)  # the run has sent its lease statement
        postgres.orphan()  # its session is gone, and nothing says so
        postgres.flow()  # the new primary answers new sessions
        await wait_until(
            lambda: count_rows(settings.database_url, "processed_events"),
            20,
            message="the event processed on a new session",
        )
