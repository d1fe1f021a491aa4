"""Attacks on the archive's truth after 12cf457..1b527e6 (completions name
their arrival; the sweep and archive_outcomes read it), in real Postgres:
the real completion SQL (a lease, complete_events), the real record of an
attempt handed on (record_handed_on, naming its arrival), the real outcome
batches (ArchiveStore.write_outcomes) and the real sweep (settle)."""

import dataclasses
import time

from tests.support.archive import arrival_of, arrived, ran, statuses
from tests.support.dead_letters import failure
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.dead_letters.model import record_dead_letter
from webhook_ingest.shared.event.message import new_arrival
from webhook_ingest.workers.claim.completions import CompletionStore

ROUTES = {"routed": ["billing", "audit"]}


async def handed_on(archive_store, *attempts) -> None:
    """Each failed attempt's retry confirmed (or dead letter committed): the worker's record of it."""
    for attempt in attempts:
        await CompletionStore(archive_store._database).record_handed_on(attempt)


async def test_a_twin_of_a_handed_on_attempt_does_not_leave_the_run_a_duplicate(archive_store):
    """A twin message of one arrival (the outbox's row beside a publish
    confirmed late) finds the arrival's attempt 1 handed on: acked as its
    copy, and its note lands first. Attempt 2 runs and completes naming the
    arrival, and its worker is SIGKILLed before its outcome batch."""
    event = arrival_of("acme", "evt_t1", 5)
    await arrived(archive_store, event)
    await handed_on(archive_store, event)  # attempt 1 failed, its retry confirmed
    at = time.time()
    # the twin's, attempt 1 handed on
    await archive_store.write_outcomes([archive.outcome_row(event, archive.DUPLICATE, at)])
    await archive_store.write_outcomes([archive.outcome_row(event, archive.RETRYING, at, "RuntimeError: 503")])
    second = dataclasses.replace(event, attempt=2)
    await ran(archive_store, second)  # attempt 2 completes; its 'processed' dies with its worker
    await archive_store._database.execute("UPDATE processed_events SET completed_at = now() - interval '5 minutes'")
    await archive_store.settle(0, ROUTES)
    assert await statuses(archive_store, event.key) == [("processed", 2)]


async def test_a_twin_of_a_handed_on_attempt_does_not_hide_the_dead_letter(archive_store):
    """As above, the chain ending in its dead letter at attempt 3, whose
    'dead' note is lost with its SIGKILLed worker."""
    event = arrival_of("acme", "evt_t2", 5)
    await arrived(archive_store, event)
    await handed_on(archive_store, event)
    await archive_store.write_outcomes([archive.outcome_row(event, archive.DUPLICATE, time.time())])  # the twin's
    dead = dataclasses.replace(event, attempt=3)
    await record_dead_letter(archive_store._database, dead, [failure(1), failure(2), failure(3)])
    await handed_on(archive_store, dataclasses.replace(event, attempt=2), dead)  # its 'dead' note died with the worker
    await archive_store._database.execute("UPDATE dead_letters SET updated_at = now() - interval '5 minutes'")
    await archive_store.settle(0, ROUTES)
    assert await statuses(archive_store, event.key) == [("dead", 3)]


async def test_a_copy_of_another_arrival_of_a_handed_on_attempt_is_archived_a_duplicate_at_once(archive_store):
    """A provider's copy (an arrival of its own) of an event whose attempt 1
    was handed on is acked as that attempt's copy: its own row says
    `duplicate` at once, not `queued` until the chain ends."""
    event = arrival_of("acme", "evt_t3", 5)
    copy = dataclasses.replace(event, arrival=new_arrival(), received_at=event.received_at + 1)
    await arrived(archive_store, event, copy)
    await handed_on(archive_store, event)
    await archive_store.write_outcomes(
        [
            archive.outcome_row(copy, archive.DUPLICATE, time.time()),
            archive.outcome_row(event, archive.RETRYING, time.time(), "RuntimeError"),
        ]
    )
    assert await statuses(archive_store, event.key) == [("retrying", 1), ("duplicate", 1)]


async def test_a_twin_after_the_previous_release_s_record_is_archived_as_before(archive_store):
    """During an upgrade the previous release's workers record an attempt
    handed on without its arrival (their statement names its columns): a
    twin of it is archived `duplicate` as before the fix (this release's
    record, the next attempt's, names the arrival again)."""
    event = arrival_of("acme", "evt_t4", 5)
    await arrived(archive_store, event)
    await archive_store._database.execute(PREVIOUS_RECORD_HANDED_ON, event.key, 0, 1, event.payload_sha256)
    await archive_store.write_outcomes([archive.outcome_row(event, archive.DUPLICATE, time.time())])
    assert await statuses(archive_store, event.key) == [("duplicate", 1)]
    await handed_on(archive_store, dataclasses.replace(event, attempt=2))
    assert (
        await archive_store._database.fetchval("SELECT arrival FROM key_fences WHERE key = $1", event.key)
        == event.arrival
    )


PREVIOUS_RECORD_HANDED_ON = """
INSERT INTO key_fences (key, token, replay_of, attempt, payload_sha256)
VALUES ($1, nextval('fencing_tokens'), $2, $3, $4)
ON CONFLICT (key) DO UPDATE SET replay_of = $2, attempt = $3, payload_sha256 = $4, updated_at = now()
WHERE key_fences.replay_of < $2 OR (key_fences.replay_of = $2 AND key_fences.attempt < $3)
"""
