"""Attacks on the archive's truth after 12cf457..1b527e6 (completions name
their arrival; the sweep and archive_outcomes read it), in real Postgres:
the real completion SQL (a lease, complete_events), the real outcome
batches (ArchiveStore.write_outcomes) and the real sweep (settle)."""

import dataclasses
import time
from datetime import timedelta

import asyncpg
import pytest

from webhook_ingest.shared import archive
from webhook_ingest.shared.archive_store import ArchiveStore
from webhook_ingest.shared.dead_letters import record_dead_letter
from webhook_ingest.shared.message import new_arrival
from tests.support.archive import ran, statuses
from tests.support.dead_letters import failure
from tests.support.events import make_event

ROUTES = {"routed": ["billing", "audit"]}


@pytest.fixture
async def store(database):
    connection = await asyncpg.connect(database)
    store = ArchiveStore(connection)
    await store.keep({source: timedelta(days=7) for source in ("acme", "routed")})
    yield store
    await connection.close()


def arrival_of(source: str, event_id: str, seconds_ago: float = 0):
    event = make_event(source, event_id, None)
    received_ms = round((time.time() - seconds_ago) * 1000)  # as a message carries it to a worker
    return dataclasses.replace(event, arrival=new_arrival(), received_at=received_ms / 1000)


async def arrived(store, *events) -> None:
    await store.write_arrivals([archive.arrival_row(e, "test.event", "{}", archive.QUEUED) for e in events])


@pytest.mark.xfail(strict=True, reason=(
    "A twin message of one arrival (the outbox's row beside a publish confirmed late) that finds the arrival's "
    "attempt 1 handed on is a DUPLICATE (workers/batch.py handed_on); its note lands first and writes 'duplicate' "
    "(0, 1) over the still-queued row. The attempt's own 'retrying' (0, 1) is then refused (not a step on), attempt 2 "
    "runs and completes naming the arrival, and its worker is SIGKILLed before its outcome batch. The sweep reads "
    "only queued/retrying rows and 1b527e6's skip only guards a duplicate written after the completion: the arrival "
    "that ran is archived 'duplicate' for good, no arrival 'processed'."))
async def test_a_twin_of_a_handed_on_attempt_does_not_leave_the_run_a_duplicate(store):
    event = arrival_of("acme", "evt_t1", 5)
    await arrived(store, event)
    at = time.time()
    await store.write_outcomes([archive.outcome_row(event, archive.DUPLICATE, at)])  # the twin's, attempt 1 handed on
    await store.write_outcomes([archive.outcome_row(event, archive.RETRYING, at, "RuntimeError: 503")])
    second = dataclasses.replace(event, attempt=2)
    await ran(store, second)  # attempt 2 completes; its 'processed' dies with its worker
    await store._database.execute("UPDATE processed_events SET completed_at = now() - interval '5 minutes'")
    await store.settle(0, ROUTES)
    assert await statuses(store, event.key) == [("processed", 2)]


@pytest.mark.xfail(strict=True, reason=(
    "As the handed-on twin above, ending in a dead letter: the twin's 'duplicate' (0, 1) lands first, the chain "
    "dies at attempt 3 (dead letter of this arrival, open) and the dead note is lost with its SIGKILLed worker. The "
    "sweep never reads a 'duplicate' row: the arrival says duplicate while its own dead letter is open."))
async def test_a_twin_of_a_handed_on_attempt_does_not_hide_the_dead_letter(store):
    event = arrival_of("acme", "evt_t2", 5)
    await arrived(store, event)
    await store.write_outcomes([archive.outcome_row(event, archive.DUPLICATE, time.time())])  # the twin's
    await record_dead_letter(store._database, dataclasses.replace(event, attempt=3),
                             [failure(1), failure(2), failure(3)])  # its 'dead' note died with the worker
    await store._database.execute("UPDATE dead_letters SET updated_at = now() - interval '5 minutes'")
    await store.settle(0, ROUTES)
    assert await statuses(store, event.key) == [("dead", 3)]
