"""A Cancel behind a dead-letter bulk runner whose act outlasts its hold of
the action (docs/reference.md §8.1 "Bulk"; shared/dead_letters/store.py
cancel_bulk: "nothing is acted on after this returns"). The runner's held
session sits idle in its transaction while the act waits: past
run_locks.HOLD_SECONDS the server ends it, its lock goes, and a Cancel
waiting for it returns. The act's statements run on that held session (a
savepoint of its transaction), so an act that comes after that fails and
changes nothing (on another pooled connection, as before, the dead letter
was discarded after the Cancel returned). Real Postgres, the real paced
run; the slow act is a wait before it (the dead letter's row locked by a
replay of it elsewhere, a busy pool)."""

import asyncio

import asyncpg

from tests.support.dead_letters import seed_dead_letters
from webhook_ingest.ingress.console.bulk import _DeadLetterJob
from webhook_ingest.shared.audit.actor import Actor
from webhook_ingest.shared.dead_letters.store import DeadLetterStore
from webhook_ingest.shared.runs import locks as run_locks
from webhook_ingest.shared.runs import paced as paced_runs

HOLD_SECONDS = 1.0  # the server's limit on the runner's held session, short for a fast test


class _SlowDiscard(DeadLetterStore):
    """A store whose discard of one dead letter waits for `answered` first."""

    def __init__(self, database):
        super().__init__(database)
        self.acting, self.answered = asyncio.Event(), asyncio.Event()

    async def discard_if_open(self, dead_letter_id, actor, bulk_action_id=None, held=None):
        self.acting.set()
        await self.answered.wait()
        return await super().discard_if_open(dead_letter_id, actor, bulk_action_id=bulk_action_id, held=held)


async def test_nothing_is_acted_on_after_a_cancel_behind_a_bulk_runner_whose_act_outlasts_its_hold(
    settings, monkeypatch
):
    monkeypatch.setattr(run_locks, "HOLD_SECONDS", HOLD_SECONDS)
    (first,) = await seed_dead_letters(settings.database_url, "acme", 1)
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)  # as the ingress's
    try:
        store = _SlowDiscard(pool)
        action = await store.claim_bulk(await store.prepare_bulk("discard", [first], {}, Actor.cli()), 1000)
        assert action is not None
        runner = asyncio.create_task(paced_runs.run(_DeadLetterJob(action, Actor.cli(), store, None, "ns")))
        await asyncio.wait_for(store.acting.wait(), 10)  # marked in flight, its act slow
        assert await store.cancel_bulk(action.id)  # returns once the runner's held session is ended
        status_when_cancelled = await pool.fetchval("SELECT status FROM dead_letters WHERE id = $1", first)
        store.answered.set()
        await asyncio.wait_for(runner, 15)
        status_after = await pool.fetchval("SELECT status FROM dead_letters WHERE id = $1", first)
        cancelled = await store.bulk_action(action.id)
    finally:
        await pool.close()
    assert (cancelled.state, cancelled.done, cancelled.in_doubt) == ("cancelled", [], [])  # its act never committed
    assert status_when_cancelled == "dead"
    assert status_after == "dead"  # nothing acted on after the Cancel returned
