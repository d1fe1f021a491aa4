"""A dead-letter bulk action whose runner died with a dead letter in flight
(its act done, its step not committed): what a Cancel, or a Resume, reports
of it (docs/reference.md §8.1 "Bulk"; shared/run_locks.py). The act's writes
commit with its step, so they die with the runner too: a discard is left
undone, exactly, while the Cancel's count stays an upper bound (a replay's
publish cannot be undone). Real Postgres, the real paced run; the runner's
death is its held session's end."""

import asyncpg

from tests.support.bulk_actions import DiesAfterItsFirstAct, cancel_from_the_console
from tests.support.dead_letters import seed_dead_letters
from tests.support.ingress import running_ingress
from webhook_ingest.ingress.console.bulk import _DeadLetterJob
from webhook_ingest.shared import paced_runs
from webhook_ingest.shared.dead_letter_store import DeadLetterStore
from webhook_ingest.shared.dead_letters import Actor
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources import load_sources

TOKEN = "operator-token-of-the-bulk-in-flight-tests"


async def _died_after_discarding_the_first(database: str, pool) -> tuple[DeadLetterStore, int, list[int]]:
    ids = await seed_dead_letters(database, "acme", 2)
    store = DeadLetterStore(pool)
    action = await store.claim_bulk(await store.prepare_bulk("discard", ids, {}, Actor.cli()), 1000)
    assert action is not None
    assert await paced_runs.run(DiesAfterItsFirstAct(action, Actor.cli(), store, None, "ns")) == "failed"
    return store, action.id, ids


async def test_a_cancel_behind_a_bulk_runner_that_died_counts_its_dead_letter_done_and_in_doubt(settings):
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)
    try:
        store, action_id, (first, second) = await _died_after_discarding_the_first(settings.database_url, pool)
        assert (await store.bulk_action(action_id)).done == []  # its step was lost with it
        assert await store.cancel_bulk(action_id)
        cancelled = await store.bulk_action(action_id)
        statuses = {row["id"]: row["status"] for row in await pool.fetch("SELECT id, status FROM dead_letters")}
    finally:
        await pool.close()
    assert (cancelled.state, cancelled.done, cancelled.skipped, cancelled.in_doubt) == ("cancelled", [first], [],
                                                                                        [first])
    assert statuses == {first: "dead", second: "dead"}  # its discard died with its step: nothing half done


async def test_a_resumed_bulk_action_counts_the_dead_letter_its_dead_runner_acted_on(settings):
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)
    try:
        store, action_id, (first, second) = await _died_after_discarding_the_first(settings.database_url, pool)
        resumed = await store.claim_bulk(action_id, 1000)  # the console's Resume of the failed action
        assert resumed is not None
        assert await paced_runs.run(_DeadLetterJob(resumed, Actor.cli(), store, None, "ns")) == "done"
        finished = await store.bulk_action(action_id)
    finally:
        await pool.close()
    assert (sorted(finished.done), finished.skipped) == (sorted([first, second]), [])


async def test_the_bulk_action_s_page_names_the_dead_letter_in_doubt(settings, monkeypatch):
    monkeypatch.setenv("WEBHOOK_INGEST_ADMIN_TOKEN", TOKEN)
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)
    try:
        store, action_id, (first, _) = await _died_after_discarding_the_first(settings.database_url, pool)
        async with running_ingress(Settings(), load_sources(None)) as client:
            cancelled = await cancel_from_the_console(client, action_id, TOKEN)
    finally:
        await pool.close()
    assert "Cancelled: what was done stays done." in cancelled
    assert f'In doubt: the cancel counts dead letter <a href="/console/dead-letters/{first}">{first}</a> discarded' \
        in cancelled
