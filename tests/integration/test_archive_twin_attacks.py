"""Attacks on the archive's truth after 12cf457..1b527e6 (completions name
their arrival; the sweep and archive_outcomes read it), in real Postgres:
the real completion SQL (a lease, complete_events), the real outcome
batches (ArchiveStore.write_outcomes) and the real sweep (settle)."""

import dataclasses
import time

import pytest

from webhook_ingest.shared import archive
from webhook_ingest.shared.dead_letters import record_dead_letter
from tests.support.archive import arrival_of, arrived, ran, statuses
from tests.support.dead_letters import failure

ROUTES = {"routed": ["billing", "audit"]}


@pytest.mark.xfail(strict=True, reason=(
    "A twin message of one arrival (the outbox's row beside a publish confirmed late) that finds the arrival's "
    "attempt 1 handed on is a DUPLICATE (workers/batch.py handed_on); its note lands first and writes 'duplicate' "
    "(0, 1) over the still-queued row. The attempt's own 'retrying' (0, 1) is then refused (not a step on), attempt 2 "
    "runs and completes naming the arrival, and its worker is SIGKILLed before its outcome batch. The sweep reads "
    "only queued/retrying rows and 1b527e6's skip only guards a duplicate written after the completion: the arrival "
    "that ran is archived 'duplicate' for good, no arrival 'processed'."))
async def test_a_twin_of_a_handed_on_attempt_does_not_leave_the_run_a_duplicate(archive_store):
    event = arrival_of("acme", "evt_t1", 5)
    await arrived(archive_store, event)
    at = time.time()
    # the twin's, attempt 1 handed on
    await archive_store.write_outcomes([archive.outcome_row(event, archive.DUPLICATE, at)])
    await archive_store.write_outcomes([archive.outcome_row(event, archive.RETRYING, at, "RuntimeError: 503")])
    second = dataclasses.replace(event, attempt=2)
    await ran(archive_store, second)  # attempt 2 completes; its 'processed' dies with its worker
    await archive_store._database.execute("UPDATE processed_events SET completed_at = now() - interval '5 minutes'")
    await archive_store.settle(0, ROUTES)
    assert await statuses(archive_store, event.key) == [("processed", 2)]


@pytest.mark.xfail(strict=True, reason=(
    "As the handed-on twin above, ending in a dead letter: the twin's 'duplicate' (0, 1) lands first, the chain "
    "dies at attempt 3 (dead letter of this arrival, open) and the dead note is lost with its SIGKILLed worker. The "
    "sweep never reads a 'duplicate' row: the arrival says duplicate while its own dead letter is open."))
async def test_a_twin_of_a_handed_on_attempt_does_not_hide_the_dead_letter(archive_store):
    event = arrival_of("acme", "evt_t2", 5)
    await arrived(archive_store, event)
    await archive_store.write_outcomes([archive.outcome_row(event, archive.DUPLICATE, time.time())])  # the twin's
    await record_dead_letter(archive_store._database, dataclasses.replace(event, attempt=3),
                             [failure(1), failure(2), failure(3)])  # its 'dead' note died with the worker
    await archive_store._database.execute("UPDATE dead_letters SET updated_at = now() - interval '5 minutes'")
    await archive_store.settle(0, ROUTES)
    assert await statuses(archive_store, event.key) == [("dead", 3)]
