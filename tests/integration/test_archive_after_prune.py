"""The archive across a `prune` (issue 35, finding 5), in real Postgres: the
real completion SQL (a lease, complete_events), the real prune
(CompletionStore.prune), the real outcome batches and the real sweep.

`make chaos SEED=7`'s `chaos:evt_00741: 2 effects, archived 1 conflict, 1
processed`: event evt completed with payload A, prune forgot it, and
arrival B (another payload) reached two workers as twin messages. One
still found A's completion (Redis remembers a completed key past a prune,
docs/reference.md §2) and noted B a `conflict`; the other ran B, which
completed naming arrival B. B's own run is its end: `processed`."""

import dataclasses
import time
from datetime import timedelta

from tests.support.archive import arrival_of, arrived, ran, statuses
from tests.support.dead_letters import failure
from webhook_ingest.shared import upkeep as archive_upkeep
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.dead_letters.model import record_dead_letter
from webhook_ingest.shared.replays.keys import replay_key
from webhook_ingest.shared.sources.model import parse_source
from webhook_ingest.shared.upkeep import ArchiveUpkeep
from webhook_ingest.workers.claim.completions import CompletionStore

ROUTES = {"routed": ["billing", "audit"]}
ROUTED_SOURCE = {
    "scheme": "github",
    "secrets": ["s"],
    "retention": "7d",
    "routes": [{"name": name, "handler": "inbox"} for name in ROUTES["routed"]],
}


async def pruned(archive_store) -> None:
    """`webhook-ingest prune` of every completion so far."""
    await archive_store._database.execute("UPDATE processed_events SET completed_at = now() - interval '1 hour'")
    await CompletionStore(archive_store._database).prune(timedelta(minutes=1))


async def upkeep_round(archive_store, monkeypatch) -> None:
    """One round of the archive's upkeep settling (the sweep, then the
    arrivals completions name), with no grace."""
    monkeypatch.setattr(archive_upkeep, "SETTLE_GRACE_SECONDS", 0.0)
    await ArchiveUpkeep(archive_store, {"routed": parse_source("routed", ROUTED_SOURCE)}).settle()


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


async def test_prune_settles_the_rows_a_lost_outcome_left_from_the_completions_it_deletes(archive_store):
    """A run whose outcome batch died with its worker, its copies' notes lost
    too: prune is the last that knows what became of them."""
    ran_first = arrival_of("acme", "evt_p1", 10)
    copy = arrival_of("acme", "evt_p1", 9)
    other_payload = arrival_of("acme", "evt_p1", 8, amount=2)
    await arrived(archive_store, ran_first, copy, other_payload)
    await ran(archive_store, ran_first)
    await pruned(archive_store)
    assert await statuses(archive_store, ran_first.key) == [("processed", 1), ("duplicate", 1), ("conflict", 1)]


async def test_prune_settles_a_routed_event_from_its_routes_completions_and_dead_letters(archive_store):
    done, failed = arrival_of("routed", "evt_p2", 5), arrival_of("routed", "evt_p3", 5)
    await arrived(archive_store, done, failed)
    await ran(
        archive_store,
        dataclasses.replace(done, key=f"{done.key}#billing", route="billing"),
        dataclasses.replace(failed, key=f"{failed.key}#billing", route="billing"),
    )
    await record_dead_letter(
        archive_store._database,
        dataclasses.replace(failed, key=f"{failed.key}#audit", route="audit", attempt=2),
        [failure(1), failure(2)],
    )
    await pruned(archive_store)
    assert await statuses(archive_store, done.key) == [("processed", 1)]
    assert await statuses(archive_store, failed.key) == [("dead", 2)]


async def test_prune_leaves_rows_its_completions_are_not_the_end_of(archive_store):
    """A replay's run (replay-R/KEY) is not its arrival's end, nor is a
    route's completion the end of the plain event that shares its key."""
    event = arrival_of("acme", "evt_p4", 5)
    lookalike = arrival_of("routed", "evt_p5#billing", 5)
    await arrived(archive_store, event, lookalike)
    await ran(
        archive_store,
        dataclasses.replace(event, key=replay_key(event.key, 7)),
        dataclasses.replace(arrival_of("routed", "evt_p5", 5), key="routed:evt_p5#billing", route="billing"),
    )
    await pruned(archive_store)
    assert await statuses(archive_store, event.key) == [("queued", 0)]
    assert await statuses(archive_store, lookalike.key) == [("queued", 0)]


async def test_a_retry_that_finds_the_event_done_ends_its_arrival_s_chain(archive_store):
    """`make chaos SEED=7`'s `chaos:evt_00198: 1 retrying left among 2
    duplicate, 1 processed`: arrival A ran; `prune` forgot its completion
    and settled the copy B `duplicate`; B's message then ran again (on a
    worker without Redis: the completion forgotten, docs/reference.md §2)
    and failed twice, and its attempt 3 found the event done (Redis still
    remembers a completion a prune forgot) and was acked as a copy. B's
    chain is over, and no completion is left for the sweep: the archive
    must not say B is still on its way."""
    first = arrival_of("acme", "evt_r1", 10)
    copy = arrival_of("acme", "evt_r1", 9)
    await arrived(archive_store, first, copy)
    await ran(archive_store, first)
    await archive_store.write_outcomes([archive.outcome_row(first, archive.PROCESSED, time.time())])
    await pruned(archive_store)
    for attempt in (1, 2):
        await archive_store.write_outcomes(
            [
                archive.outcome_row(
                    dataclasses.replace(copy, attempt=attempt), archive.RETRYING, time.time(), "RuntimeError: boom"
                )
            ]
        )
    await archive_store.write_outcomes(
        [archive.outcome_row(dataclasses.replace(copy, attempt=3), archive.DUPLICATE, time.time())]
    )
    await archive_store.settle(0, ROUTES)
    assert await statuses(archive_store, first.key) == [("processed", 1), ("duplicate", 3)]


async def test_a_twin_of_a_retry_still_leaves_its_attempt_s_own_end(archive_store):
    """What the rule above must keep: a twin of the attempt that failed
    (the outbox's row beside a publish confirmed late), acked as a copy of
    the attempt handed on, is not the arrival's end, even with the key's
    fence naming no arrival (the previous release's, during an upgrade)."""
    event = arrival_of("acme", "evt_r2", 5)
    await arrived(archive_store, event)
    retried = dataclasses.replace(event, attempt=2)
    await archive_store.write_outcomes([archive.outcome_row(retried, archive.RETRYING, time.time(), "boom")])
    await archive_store.write_outcomes([archive.outcome_row(retried, archive.DUPLICATE, time.time())])
    assert await statuses(archive_store, event.key) == [("retrying", 2)]


async def test_a_copy_prune_settled_that_then_runs_is_processed_though_its_batch_died(archive_store, monkeypatch):
    """`make chaos SEED=7`'s `chaos:evt_00309: 2 effects, archived 3
    duplicate, 1 processed` (read from a kept run): arrival A ran; B's message was still on its way
    (deferred: the key's turn taken) when `prune` deleted A's completion
    and settled B, still queued, `duplicate` of A. B's message then ran,
    which the prune allows (docs/reference.md §2), and completed naming B;
    its worker was SIGKILLed before its outcome batch. B ran: the archive
    must say so (reference §2, events show: "a duplicate ... noted of it
    first ... becomes processed once the run completes")."""
    first = arrival_of("acme", "evt_r3", 10)
    copy = arrival_of("acme", "evt_r3", 9)
    await arrived(archive_store, first, copy)
    await ran(archive_store, first)
    await archive_store.write_outcomes([archive.outcome_row(first, archive.PROCESSED, time.time())])
    await pruned(archive_store)
    await ran(archive_store, copy)  # its `processed` died with its worker
    await upkeep_round(archive_store, monkeypatch)
    assert await statuses(archive_store, first.key) == [("processed", 1), ("processed", 1)]


async def test_the_upkeep_leaves_the_copies_and_conflicts_no_completion_names(archive_store, monkeypatch):
    """What the rule above must keep: a real copy (`duplicate`, the ingress's
    or the prune's) and another payload (`conflict`) of an event whose
    completion names another arrival stay as they are, routed or not; and
    a copy settled `duplicate` by a sweep guessing which arrival ran (a
    completion naming none) is not made a second `processed`."""
    ran_first = arrival_of("acme", "evt_k1", 10)
    copy = arrival_of("acme", "evt_k1", 9)
    other_payload = arrival_of("acme", "evt_k1", 8, amount=2)
    answered_copy = arrival_of("acme", "evt_k1", 7)
    await arrived(archive_store, ran_first, copy, other_payload)
    await arrived(archive_store, answered_copy, status=archive.DUPLICATE)
    await ran(archive_store, ran_first)
    await archive_store.write_outcomes(
        [
            archive.outcome_row(run, status, time.time())
            for run, status in (
                (ran_first, archive.PROCESSED),
                (copy, archive.DUPLICATE),
                (other_payload, archive.CONFLICT),
            )
        ]
    )
    routed = arrival_of("routed", "evt_k2", 10)
    routed_copy = arrival_of("routed", "evt_k2", 9)
    await arrived(archive_store, routed, routed_copy)
    await ran(archive_store, dataclasses.replace(routed, key=f"{routed.key}#billing", route="billing"))
    await archive_store.write_outcomes([archive.outcome_row(routed_copy, archive.DUPLICATE, time.time())])
    guessed = arrival_of("acme", "evt_k3", 10)
    guessed_copy = arrival_of("acme", "evt_k3", 9)
    await arrived(archive_store, guessed, guessed_copy)
    await ran(archive_store, dataclasses.replace(guessed_copy))
    await archive_store._database.execute("UPDATE processed_events SET arrival = NULL WHERE key = $1", guessed.key)
    await upkeep_round(archive_store, monkeypatch)  # the sweep guesses: the oldest ran
    await archive_store._database.execute(
        "UPDATE processed_events SET arrival = $2 WHERE key = $1", guessed.key, guessed_copy.arrival
    )  # a previous release's guess, seen so
    await upkeep_round(archive_store, monkeypatch)
    assert await statuses(archive_store, ran_first.key) == [
        ("processed", 1),
        ("duplicate", 1),
        ("conflict", 1),
        ("duplicate", 0),
    ]
    assert await statuses(archive_store, routed.key) == [("processed", 1), ("duplicate", 1)]
    assert await statuses(archive_store, guessed.key) == [("processed", 1), ("duplicate", 1)]
