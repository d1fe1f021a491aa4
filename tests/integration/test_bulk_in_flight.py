"""A dead-letter bulk action whose runner died with a dead letter in flight
(its act done, its step not committed): what a Cancel, or a Resume, reports
of it (docs/reference.md §8.1 "Bulk"; shared/runs/locks.py). The act's writes
commit with its step, so they die with the runner too: a discard is left
undone, and the Cancel says so, exactly; a replay's publish cannot be
undone, so the Cancel counts it done and in doubt (an upper bound). The
previous release's runner, whose discard commits apart from its step:
tests/integration/shared/dead_letters/test_bulk.py. Real Postgres, the real
paced run, a real broker for the replay; the runner's death is its held
session's end."""

import asyncpg
import pytest

from tests.support.bulk_actions import cancel_from_the_console, connected_publisher, died_after_its_first_act
from tests.support.dead_letters import seed_dead_letters
from tests.support.ingress import running_ingress
from webhook_ingest.ingress.console.bulk import _DeadLetterJob
from webhook_ingest.shared.audit.actor import Actor
from webhook_ingest.shared.dead_letters.store import DeadLetterStore
from webhook_ingest.shared.runs import paced as paced_runs
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources

TOKEN = "operator-token-of-the-bulk-in-flight-tests"


@pytest.fixture
async def pool(settings):
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)  # as the ingress's
    yield pool
    await pool.close()


@pytest.fixture
def store(pool) -> DeadLetterStore:
    return DeadLetterStore(pool)


async def test_a_cancel_behind_a_bulk_runner_that_died_mid_discard_counts_it_not_done(settings, pool, store):
    first, second = await seed_dead_letters(settings.database_url, "acme", 2)
    action = await died_after_its_first_act(store, "discard", [first, second], Actor.cli())
    assert (await store.bulk_action(action.id)).done == []  # its step was lost with it
    assert await store.cancel_bulk(action.id)
    cancelled = await store.bulk_action(action.id)
    statuses = {row["id"]: row["status"] for row in await pool.fetch("SELECT id, status FROM dead_letters")}
    assert statuses == {first: "dead", second: "dead"}  # its discard died with its step
    assert (cancelled.state, cancelled.done, cancelled.skipped, cancelled.in_doubt) == ("cancelled", [], [], [])


async def test_a_cancel_behind_a_bulk_runner_that_died_mid_replay_counts_it_done_and_in_doubt(settings, store):
    first, second = await seed_dead_letters(settings.database_url, "acme", 2)
    async with connected_publisher(settings) as publisher:
        action = await died_after_its_first_act(
            store, "replay", [first, second], Actor.cli(), publisher=publisher, namespace=settings.namespace
        )
        assert await store.cancel_bulk(action.id)
    cancelled = await store.bulk_action(action.id)
    # its publish went out before its session ended, and cannot be taken back: counted, and said so
    assert (cancelled.state, cancelled.done, cancelled.skipped, cancelled.in_doubt) == (
        "cancelled",
        [first],
        [],
        [first],
    )


async def test_a_resumed_bulk_action_counts_the_dead_letter_its_dead_runner_acted_on(settings, store):
    first, second = await seed_dead_letters(settings.database_url, "acme", 2)
    action = await died_after_its_first_act(store, "discard", [first, second], Actor.cli())
    resumed = await store.claim_bulk(action.id, 1000)  # the console's Resume of the failed action
    assert resumed is not None
    assert await paced_runs.run(_DeadLetterJob(resumed, Actor.cli(), store, None, "ns")) == "done"
    finished = await store.bulk_action(action.id)
    assert (sorted(finished.done), finished.skipped) == (sorted([first, second]), [])


async def test_the_bulk_action_s_page_names_no_dead_letter_in_doubt_after_a_discard_that_died(
    settings, store, monkeypatch
):
    monkeypatch.setenv("WEBHOOK_INGEST_ADMIN_TOKEN", TOKEN)
    action = await died_after_its_first_act(
        store, "discard", await seed_dead_letters(settings.database_url, "acme", 2), Actor.cli()
    )
    async with running_ingress(Settings(), load_sources(None)) as client:
        cancelled = await cancel_from_the_console(client, action.id, TOKEN)
    assert "Cancelled: what was done stays done." in cancelled
    assert "In doubt" not in cancelled
