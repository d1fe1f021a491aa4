"""The archive across a `prune` (issue 35, finding 5), in real Postgres: the
real completion SQL (a lease, complete_events), the real prune
(CompletionStore.prune), the real outcome batches and the real sweep.

`make chaos SEED=7`'s `chaos:evt_00741: 2 effects, archived 1 conflict, 1
processed`: event evt completed with payload A, prune forgot it, and
arrival B (another payload) reached two workers as twin messages. One
still found A's completion (Redis remembers a completed key past a prune,
docs/reference.md §2) and noted B a `conflict`; the other ran B, which
completed naming arrival B. B's own run is its end: `processed`."""

import time
from datetime import timedelta

import pytest

from webhook_ingest.shared import archive
from webhook_ingest.workers.completions import CompletionStore
from tests.support.archive import arrival_of, arrived, ran, statuses


async def pruned(archive_store) -> None:
    """`webhook-ingest prune` of every completion so far."""
    await archive_store._database.execute("UPDATE processed_events SET completed_at = now() - interval '1 hour'")
    await CompletionStore(archive_store._database).prune(timedelta(minutes=1))


@pytest.mark.xfail(strict=True, reason="issue 35 #5: a run's processed does not step over its twin's conflict")
async def test_a_run_after_a_prune_steps_over_the_conflict_a_twin_noted(archive_store):
    first = arrival_of("acme", "evt_c1", 10)
    other = arrival_of("acme", "evt_c1", 5, amount=2)
    await arrived(archive_store, first, other)
    await ran(archive_store, first)
    await archive_store.write_outcomes([archive.outcome_row(first, archive.PROCESSED, time.time())])
    await pruned(archive_store)
    # the twin that still saw A's completion, then the run of B itself (its completion names B)
    await archive_store.write_outcomes([archive.outcome_row(other, archive.CONFLICT, time.time())])
    await ran(archive_store, other)
    await archive_store.write_outcomes([archive.outcome_row(other, archive.PROCESSED, time.time())])
    assert await statuses(archive_store, first.key) == [("processed", 1), ("processed", 1)]
