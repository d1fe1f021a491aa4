"""A dead-letter bulk action whose runner died with a dead letter in flight
(its act done, its step not committed): what a Cancel, or a Resume, reports
of it (docs/reference.md §8.1 "Bulk"; shared/run_locks.py). The act's writes
commit with its step, so they die with the runner too: a discard is left
undone, and the Cancel says so, exactly; a replay's publish cannot be
undone, so the Cancel counts it done and in doubt (an upper bound). Real
Postgres, the real paced run, a real broker for the replay; the runner's
death is its held session's end."""

import asyncpg

from tests.support.bulk_actions import DiesAfterItsFirstAct, cancel_from_the_console
from tests.support.dead_letters import seed_dead_letters
from tests.support.ingress import running_ingress
from tests.support.processes import wait_until
from webhook_ingest.ingress.publisher import Publisher
from webhook_ingest.ingress.console.bulk import _DeadLetterJob
from webhook_ingest.shared import paced_runs
from webhook_ingest.shared.dead_letter_store import DeadLetterStore
from webhook_ingest.shared.dead_letters import Actor
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources import load_sources

TOKEN = "operator-token-of-the-bulk-in-flight-tests"


async def _died_after_its_first_act(database: str, pool, action: str = "discard", publisher=None,
                                    namespace: str = "ns") -> tuple[DeadLetterStore, int, list[int]]:
    ids = await seed_dead_letters(database, "acme", 2)
    store = DeadLetterStore(pool)
    claimed = await store.claim_bulk(await store.prepare_bulk(action, ids, {}, Actor.cli()), 1000)
    assert claimed is not None
    assert await paced_runs.run(DiesAfterItsFirstAct(claimed, Actor.cli(), store, publisher, namespace)) == "failed"
    return store, claimed.id, ids


async def test_a_cancel_behind_a_bulk_runner_that_died_mid_discard_counts_it_not_done(settings):
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)
    try:
        store, action_id, (first, second) = await _died_after_its_first_act(settings.database_url, pool)
        assert (await store.bulk_action(action_id)).done == []  # its step was lost with it
        assert await store.cancel_bulk(action_id)
        cancelled = await store.bulk_action(action_id)
        statuses = {row["id"]: row["status"] for row in await pool.fetch("SELECT id, status FROM dead_letters")}
    finally:
        await pool.close()
    assert statuses == {first: "dead", second: "dead"}  # its discard died with its step: nothing half done
    assert (cancelled.state, cancelled.done, cancelled.skipped, cancelled.in_doubt) == ("cancelled", [], [], [])


class _PreviousReleaseDiesAfterItsFirstAct(DiesAfterItsFirstAct):
    """A runner of the previous release (during an upgrade): its discard
    commits apart from its step, then its session ends before the step."""

    async def act(self, dead_letter_id):
        await self._store.discard_if_open(dead_letter_id, self.actor, bulk_action_id=self.id)
        assert self._held is not None
        self._held.hold.connection.terminate()
        return True


async def test_a_cancel_behind_a_previous_release_s_runner_counts_the_discard_it_committed(settings):
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)
    try:
        first, second = await seed_dead_letters(settings.database_url, "acme", 2)
        store = DeadLetterStore(pool)
        action = await store.claim_bulk(await store.prepare_bulk("discard", [first, second], {}, Actor.cli()), 1000)
        assert action is not None
        runner = _PreviousReleaseDiesAfterItsFirstAct(action, Actor.cli(), store, None, "ns")
        assert await paced_runs.run(runner) == "failed"
        assert await store.cancel_bulk(action.id)
        cancelled = await store.bulk_action(action.id)
        statuses = {row["id"]: row["status"] for row in await pool.fetch("SELECT id, status FROM dead_letters")}
    finally:
        await pool.close()
    assert statuses == {first: "discarded", second: "dead"}
    assert (cancelled.state, cancelled.done, cancelled.in_doubt) == ("cancelled", [first], [])  # done, and known


async def test_a_cancel_behind_a_bulk_runner_that_died_mid_replay_counts_it_done_and_in_doubt(settings):
    publisher = Publisher(settings.amqp_url, settings.namespace, settings.delivery_limit)
    publisher.start()
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)
    try:
        await wait_until(lambda: _ready(publisher), 10, 0.02, "the publisher to connect")
        store, action_id, (first, _) = await _died_after_its_first_act(
            settings.database_url, pool, "replay", publisher, settings.namespace)
        assert await store.cancel_bulk(action_id)
        cancelled = await store.bulk_action(action_id)
    finally:
        await pool.close()
        await publisher.close()
    # its publish went out before its session ended, and cannot be taken back: counted, and said so
    assert (cancelled.state, cancelled.done, cancelled.skipped, cancelled.in_doubt) == ("cancelled", [first], [],
                                                                                        [first])


async def _ready(publisher: Publisher) -> bool:
    return publisher.ready


async def test_a_resumed_bulk_action_counts_the_dead_letter_its_dead_runner_acted_on(settings):
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)
    try:
        store, action_id, (first, second) = await _died_after_its_first_act(settings.database_url, pool)
        resumed = await store.claim_bulk(action_id, 1000)  # the console's Resume of the failed action
        assert resumed is not None
        assert await paced_runs.run(_DeadLetterJob(resumed, Actor.cli(), store, None, "ns")) == "done"
        finished = await store.bulk_action(action_id)
    finally:
        await pool.close()
    assert (sorted(finished.done), finished.skipped) == (sorted([first, second]), [])


async def test_the_bulk_action_s_page_names_no_dead_letter_in_doubt_after_a_discard_that_died(
        settings, monkeypatch):
    monkeypatch.setenv("WEBHOOK_INGEST_ADMIN_TOKEN", TOKEN)
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)
    try:
        _, action_id, _ = await _died_after_its_first_act(settings.database_url, pool)
        async with running_ingress(Settings(), load_sources(None)) as client:
            cancelled = await cancel_from_the_console(client, action_id, TOKEN)
    finally:
        await pool.close()
    assert "Cancelled: what was done stays done." in cancelled
    assert "In doubt" not in cancelled
