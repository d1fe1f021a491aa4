"""A Cancel of a dead-letter bulk discard whose runner died with a dead
letter in flight counts it done only if this action discarded it
(docs/reference.md §8.1 "Bulk": "one whose runner died while discarding it
is known ... never in doubt"; "Audit": every discard, who, which ids).
The runner's discard commits with its step, so a dead letter in flight and
not stepped that another operator discarded meanwhile (its own page's
Discard, `dlq discard`: audited `discard` under that operator) was not
this action's: counted done (as 4bb6caf did), the Cancel's
`bulk_discard_cancelled` entry named a second discarder of it, and the
action's page one discard too many, not even in doubt. And the runner's
own end entry names only what committed. Real Postgres, the real paced
run (attacker review of 4bb6caf)."""

import asyncio

import asyncpg
import pytest

from tests.support.bulk_actions import (
    DiesAfterItsFirstAct,
    PreviousReleaseDiesAfterItsFirstAct,
    cancel_from_the_console,
    claimed_bulk,
    connected_publisher,
    died_after_its_first_act,
)
from tests.support.dead_letters import seed_dead_letters
from tests.support.ingress import running_ingress
from webhook_ingest.ingress.console.bulk import _DeadLetterJob
from webhook_ingest.shared.audit.actor import Actor
from webhook_ingest.shared.dead_letters.model import SQL
from webhook_ingest.shared.dead_letters.store import DeadLetterStore
from webhook_ingest.shared.runs import locks as run_locks
from webhook_ingest.shared.runs import paced as paced_runs
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources

OPERATOR_A = Actor("operator", "console", "alice")
OPERATOR_B = Actor("operator", "console", "bob")


async def test_a_cancel_does_not_count_a_dead_letter_another_operator_discarded_after_the_runner_died(settings):
    first, second = await seed_dead_letters(settings.database_url, "acme", 2)
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)
    try:
        store = DeadLetterStore(pool)
        # The runner dies with `first` in flight: its discard dies with its step.
        action = await died_after_its_first_act(store, "discard", [first, second], OPERATOR_A)
        assert await pool.fetchval("SELECT status FROM dead_letters WHERE id = $1", first) == "dead"
        # Bob discards `first` from its own page before Alice cancels the action.
        await store.discard_if_open(first, OPERATOR_B)
        assert await store.cancel_bulk(action.id, OPERATOR_A)
        cancelled = await store.bulk_action(action.id)
        audit = [
            (row["name"], row["action"], row["dead_letter_ids"])
            for row in await pool.fetch(
                "SELECT name, action, dead_letter_ids FROM audit_log"
                " WHERE action IN ('discard', 'bulk_discard_cancelled')"
                " ORDER BY id"
            )
        ]
    finally:
        await pool.close()
    assert audit[0] == ("bob", "discard", [first])
    # The action discarded nothing: one discarder of `first` in the log, Bob.
    assert (cancelled.state, cancelled.done, cancelled.in_doubt) == ("cancelled", [], [])
    assert audit[1:] == [("alice", "bulk_discard_cancelled", [])]


async def test_a_cancel_still_counts_the_discard_a_runner_of_the_previous_release_committed(settings):
    """The case 4bb6caf counts done: the discard committed apart from its step,
    by the action's own runner, and nobody else's entry names it."""
    first, second = await seed_dead_letters(settings.database_url, "acme", 2)
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)
    try:
        store = DeadLetterStore(pool)
        action = await died_after_its_first_act(
            store, "discard", [first, second], OPERATOR_A, PreviousReleaseDiesAfterItsFirstAct
        )
        assert await store.cancel_bulk(action.id, OPERATOR_A)
        cancelled = await store.bulk_action(action.id)
    finally:
        await pool.close()
    assert (cancelled.state, cancelled.done, cancelled.in_doubt) == ("cancelled", [first], [])


async def test_a_cancel_does_not_count_a_dead_letter_another_bulk_discard_discarded(settings):
    """Another bulk discard over the same dead letter, run to its end after
    this action's runner died with it in flight: that action's, not this one's."""
    first, second = await seed_dead_letters(settings.database_url, "acme", 2)
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)
    try:
        store = DeadLetterStore(pool)
        action = await died_after_its_first_act(store, "discard", [first, second], OPERATOR_A)
        other = await claimed_bulk(store, "discard", [first], OPERATOR_B)
        assert await paced_runs.run(_job(other, store)) == "done"
        assert (await store.bulk_action(other.id)).done == [first]
        assert await store.cancel_bulk(action.id, OPERATOR_A)
        cancelled = await store.bulk_action(action.id)
    finally:
        await pool.close()
    assert (cancelled.state, cancelled.done, cancelled.in_doubt) == ("cancelled", [], [])


async def test_a_runner_whose_session_was_cut_mid_discard_names_no_discard_in_its_end_entry(settings):
    """The runner's process lives on (Postgres cut from its held session, a
    failover, the session ended past its limit after the act): its discard
    rolled back with the lost step, yet its `bulk_discard` end entry
    (state failed) named the dead letter, which is still open, as discarded.
    A bulk replay's publish, which cannot be undone, is another matter."""
    first, second = await seed_dead_letters(settings.database_url, "acme", 2)
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)
    try:
        store = DeadLetterStore(pool)
        await died_after_its_first_act(store, "discard", [first, second], OPERATOR_A)
        status = await pool.fetchval("SELECT status FROM dead_letters WHERE id = $1", first)
        ended = await pool.fetchrow("SELECT dead_letter_ids, detail FROM audit_log WHERE action = 'bulk_discard'")
    finally:
        await pool.close()
    assert status == "dead"
    assert '"failed"' in ended["detail"]
    assert ended["dead_letter_ids"] == []  # it discarded nothing


def _job(action, store):
    from webhook_ingest.ingress.console.bulk import _DeadLetterJob

    return _DeadLetterJob(action, OPERATOR_B, store, None, "ns")


class _PreviousReleaseFrozenMidDiscard(DiesAfterItsFirstAct):
    """A runner of the previous release, its discard on a pooled connection
    of its own (no time limit), frozen mid-act (a suspended VM) past
    HOLD_SECONDS: the server ends its held session, which lets the run go,
    and its discard commits once it wakes (`resume`)."""

    def __init__(self, *args, database_url: str):
        super().__init__(*args)
        self._database_url = database_url
        self.acting, self.resume = asyncio.Event(), asyncio.Event()

    async def act(self, dead_letter_id):
        own = await asyncpg.connect(self._database_url)
        try:
            async with own.transaction():
                await own.fetchrow(SQL["lock_dead_letter"], dead_letter_id)
                await own.execute(SQL["set_dead_letter_status"], [dead_letter_id], "discarded")
                assert self._held is not None
                self._held.hold.connection.terminate()  # idle past HOLD_SECONDS: the server ended it
                self.acting.set()
                await self.resume.wait()
        finally:
            await own.close()
        return True


async def test_a_cancel_behind_a_previous_release_runner_frozen_mid_discard_counts_the_discard_that_lands(settings):
    """Before 4bb6caf this Cancel counted the dead letter done and in doubt (an
    upper bound); since, it reads it `dead` (the discard not committed yet),
    says nothing was discarded and nothing is in doubt, and the discard
    commits a moment later: the action discarded one its report and its
    `bulk_discard_cancelled` entry say it did not."""
    first, second = await seed_dead_letters(settings.database_url, "acme", 2)
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)
    try:
        store = DeadLetterStore(pool)
        action = await claimed_bulk(store, "discard", [first, second], OPERATOR_A)
        runner = _PreviousReleaseFrozenMidDiscard(
            action, OPERATOR_A, store, None, "ns", database_url=settings.database_url
        )
        run = asyncio.create_task(paced_runs.run(runner))
        await asyncio.wait_for(runner.acting.wait(), 10)
        cancel = asyncio.create_task(store.cancel_bulk(action.id, OPERATOR_A))
        await asyncio.sleep(1.0)  # the Cancel has answered, or waits for the discard in progress
        runner.resume.set()  # the runner wakes: its discard commits
        assert await asyncio.wait_for(cancel, 10)
        assert await asyncio.wait_for(run, 10) == "failed"
        cancelled = await store.bulk_action(action.id)
        status = await pool.fetchval("SELECT status FROM dead_letters WHERE id = $1", first)
    finally:
        await pool.close()
    assert status == "discarded"  # by this action's runner
    assert (cancelled.state, cancelled.done) == ("cancelled", [first])


async def test_a_resume_does_not_count_what_another_operator_did_to_the_dead_letter_in_flight(settings):
    """The Resume's side of the same question (bulk.py `step`): the dead
    letter its dead runner had in flight is no longer open, Bob having
    replayed `first` and discarded `third` from their pages meanwhile. It
    counted both discarded by this action (its done list: a dead letter
    whose status says `replayed`), not skipped as changed meanwhile."""
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)
    try:
        first, second, third = await seed_dead_letters(settings.database_url, "acme", 3)
        store = DeadLetterStore(pool)
        done = {}
        for other in (first, third):
            action = await died_after_its_first_act(store, "discard", [other, second], OPERATOR_A)
            if other == first:
                async with connected_publisher(settings) as publisher:
                    await store.replay_if_open(publisher.channel, settings.namespace, first, OPERATOR_B)
            else:
                await store.discard_if_open(third, OPERATOR_B)
            resumed = await store.claim_bulk(action.id, 1000)
            assert resumed is not None
            assert await paced_runs.run(_job(resumed, store)) == "done"
            done[other] = await store.bulk_action(action.id)
        statuses = {row["id"]: row["status"] for row in await pool.fetch("SELECT id, status FROM dead_letters")}
    finally:
        await pool.close()
    assert statuses == {first: "replayed", second: "discarded", third: "discarded"}
    assert (done[first].done, done[first].skipped) == ([second], [first])  # Bob's replay, not this discard
    assert (done[third].done, done[third].skipped) == ([], [third, second])  # second: the first action's


async def test_a_resume_still_counts_the_discard_a_runner_of_the_previous_release_committed(settings):
    first, second = await seed_dead_letters(settings.database_url, "acme", 2)
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)
    try:
        store = DeadLetterStore(pool)
        action = await died_after_its_first_act(
            store, "discard", [first, second], OPERATOR_A, PreviousReleaseDiesAfterItsFirstAct
        )
        resumed = await store.claim_bulk(action.id, 1000)
        assert resumed is not None
        assert await paced_runs.run(_job(resumed, store)) == "done"
        finished = await store.bulk_action(action.id)
    finally:
        await pool.close()
    assert (finished.done, finished.skipped) == ([first, second], [])


# The audit log of a dead-letter bulk action whose runner died (SIGKILL)
# with a dead letter acted on and not stepped, then cancelled from the
# console (docs/reference.md §8.1 "Audit": every replay and discard, which
# ids). A runner that dies writes no end entry; the Cancel writes
# `bulk_ACTION_cancelled` with the ids counted done (of a replay, the one in
# flight too, in doubt: it may have been published), as an event replay's
# writes `events_replay_cancelled`. A discard's writes commit with its step,
# so the killed runner's died with it, and the entry names none. Real
# Postgres, the real paced run and console.

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


# A Cancel behind a dead-letter bulk runner whose act outlasts its hold of
# the action (docs/reference.md §8.1 "Bulk"; shared/dead_letters/store.py
# cancel_bulk: "nothing is acted on after this returns"). The runner's held
# session sits idle in its transaction while the act waits: past
# run_locks.HOLD_SECONDS the server ends it, its lock goes, and a Cancel
# waiting for it returns. The act's statements run on that held session (a
# savepoint of its transaction), so an act that comes after that fails and
# changes nothing (on another pooled connection, as before, the dead letter
# was discarded after the Cancel returned). Real Postgres, the real paced
# run; the slow act is a wait before it (the dead letter's row locked by a
# replay of it elsewhere, a busy pool).

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


# A dead-letter bulk action whose runner died with a dead letter in flight
# (its act done, its step not committed): what a Cancel, or a Resume, reports
# of it (docs/reference.md §8.1 "Bulk"; shared/runs/locks.py). The act's writes
# commit with its step, so they die with the runner too: a discard is left
# undone, and the Cancel says so, exactly; a replay's publish cannot be
# undone, so the Cancel counts it done and in doubt (an upper bound). The
# previous release's runner, whose discard commits apart from its step:
# the first tests of this file. Real Postgres, the real
# paced run, a real broker for the replay; the runner's death is its held
# session's end.

IN_FLIGHT_TOKEN = "operator-token-of-the-bulk-in-flight-tests"


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
    monkeypatch.setenv("WEBHOOK_INGEST_ADMIN_TOKEN", IN_FLIGHT_TOKEN)
    action = await died_after_its_first_act(
        store, "discard", await seed_dead_letters(settings.database_url, "acme", 2), Actor.cli()
    )
    async with running_ingress(Settings(), load_sources(None)) as client:
        cancelled = await cancel_from_the_console(client, action.id, IN_FLIGHT_TOKEN)
    assert "Cancelled: what was done stays done." in cancelled
    assert "In doubt" not in cancelled
