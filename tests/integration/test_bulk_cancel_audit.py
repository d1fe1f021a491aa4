"""The audit log of a dead-letter bulk action whose runner died (SIGKILL)
with a dead letter acted on and not stepped, then cancelled from the
console (docs/reference.md §8.1 "Audit": every replay and discard, which
ids). A runner that dies writes no end entry; the Cancel writes
`bulk_ACTION_cancelled` with the ids counted done (of a replay, the one in
flight too, in doubt: it may have been published), as an event replay's
writes `events_replay_cancelled`. A discard's writes commit with its step,
so the killed runner's died with it, and the entry names none. Real
Postgres, the real paced run and console."""

import asyncpg

from tests.support.bulk_actions import DiesAfterItsFirstAct, cancel_from_the_console
from tests.support.dead_letters import seed_dead_letters
from tests.support.ingress import running_ingress
from webhook_ingest.shared.audit.actor import Actor
from webhook_ingest.shared.dead_letters.store import DeadLetterStore
from webhook_ingest.shared.runs import paced as paced_runs
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources

TOKEN = "operator-token-of-the-bulk-cancel-audit-tests"


class _KilledAfterItsFirstAct(DiesAfterItsFirstAct):
    """A runner SIGKILLed once its first dead letter is discarded, before its
    step commits: its held session ends, and it writes no end entry."""

    async def audit(self, what, acted, **detail):
        if acted is None:  # the start's entry, written before it died
            await super().audit(what, acted, **detail)


async def test_a_cancel_behind_a_killed_bulk_runner_leaves_an_audit_entry_of_what_it_discarded_none(
    settings, monkeypatch
):
    monkeypatch.setenv("WEBHOOK_INGEST_ADMIN_TOKEN", TOKEN)
    first, second = await seed_dead_letters(settings.database_url, "acme", 2)
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)
    try:
        store = DeadLetterStore(pool)
        action = await store.claim_bulk(await store.prepare_bulk("discard", [first, second], {}, Actor.cli()), 1000)
        assert action is not None
        assert await paced_runs.run(_KilledAfterItsFirstAct(action, Actor.cli(), store, None, "ns")) == "failed"
        async with running_ingress(Settings(), load_sources(None)) as client:
            cancelled = await cancel_from_the_console(client, action.id, TOKEN)
        status = await pool.fetchval("SELECT status FROM dead_letters WHERE id = $1", first)
        audit = await pool.fetch("SELECT action, dead_letter_ids FROM audit_log ORDER BY id")
    finally:
        await pool.close()
    assert "Cancelled: what was done stays done." in cancelled
    assert status == "dead"  # its discard died uncommitted with its step: nothing half done
    done = [(row["action"], row["dead_letter_ids"]) for row in audit if not row["action"].endswith("_started")]
    assert done == [("bulk_discard_cancelled", [])]  # its discard never committed: nothing done, nothing in doubt
