"""The archive's settling sweep in real Postgres (shared/archive/settling.py,
ArchiveStore.settle): rows a killed worker's lost outcome batch left
`queued` or `retrying`, brought up to what processed_events and
dead_letters recorded of their event; rows still on their way left alone."""

import asyncio
import dataclasses
import threading
import time
from datetime import timedelta

import asyncpg
import pytest
from click.testing import CliRunner

from tests.support.archive import arrival_of, arrived, ran, statuses
from tests.support.dead_letters import failure
from tests.support.ingress import queued_events
from tests.support.processes import wait_until
from webhook_ingest.cli.main import main
from webhook_ingest.shared import upkeep as archive_upkeep
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.archive import settling as archive_settling
from webhook_ingest.shared.archive.store import SQL, ArchiveStore
from webhook_ingest.shared.dead_letters.model import record_dead_letter
from webhook_ingest.shared.event.message import new_arrival
from webhook_ingest.shared.replays.keys import replay_key
from webhook_ingest.shared.sources.model import parse_source
from webhook_ingest.shared.upkeep import ArchiveUpkeep
from webhook_ingest.workers.claim.completions import CompletionStore

ROUTES = {"routed": ["billing", "audit"]}


async def completed(archive_store, key: str, event, attempts: int = 1) -> None:
    await archive_store._database.execute(
        "INSERT INTO processed_events (key, source, event_id, payload_sha256, attempts) VALUES ($1, $2, $3, $4, $5)",
        key,
        event.source,
        event.event_id,
        event.payload_sha256,
        attempts,
    )


async def test_copies_of_a_completed_event_settle_as_one_processed_and_its_copies(archive_store):
    first = arrival_of("acme", "evt_1", 5)
    copy = dataclasses.replace(first, arrival=new_arrival(), received_at=first.received_at + 0.001)
    same_ms = dataclasses.replace(copy, arrival=new_arrival())
    other_payload = arrival_of("acme", "evt_1", 4, amount=2)
    await arrived(archive_store, first, copy, same_ms, other_payload)
    await completed(archive_store, first.key, first)
    assert await archive_store.settle(0, ROUTES) == (4, None)
    assert await statuses(archive_store, first.key) == [
        ("processed", 1),
        ("duplicate", 1),
        ("duplicate", 1),
        ("conflict", 1),
    ]
    assert await archive_store.settle(0, ROUTES) == (0, None)  # idempotent: nothing left unsettled


async def test_a_copy_settles_as_a_duplicate_of_the_arrival_archived_processed(archive_store):
    first, copy = arrival_of("acme", "evt_2", 5), arrival_of("acme", "evt_2", 3)
    await arrived(archive_store, first, copy)
    await archive_store.write_outcomes([archive.outcome_row(first, archive.PROCESSED, time.time())])
    await completed(archive_store, first.key, first)
    await archive_store.settle(0, ROUTES)
    assert await statuses(archive_store, first.key) == [("processed", 1), ("duplicate", 1)]


async def test_a_dead_event_settles_dead_and_a_discarded_one_discarded(archive_store):
    dead, discarded = arrival_of("acme", "evt_3", 5), arrival_of("acme", "evt_4", 5)
    copy_of_discarded = dataclasses.replace(discarded, arrival=new_arrival(), received_at=discarded.received_at + 1)
    await arrived(archive_store, dead, discarded, copy_of_discarded)
    connection = archive_store._database
    await record_dead_letter(connection, dataclasses.replace(dead, attempt=3), [failure(1), failure(2), failure(3)])
    gone = await record_dead_letter(connection, discarded, [failure(1)])
    await connection.execute("UPDATE dead_letters SET status = 'discarded' WHERE id = $1", gone)
    await archive_store.settle(0, ROUTES)
    assert await statuses(archive_store, dead.key) == [("dead", 3)]
    assert await statuses(archive_store, discarded.key) == [("discarded", 1), ("dead", 1)]


async def test_a_copy_settled_dead_that_then_runs_shows_its_own_outcome(archive_store):
    """A copy still in the queue when its event went dead is settled `dead`
    by the event's dead letter; run later (its handler fixed) it completes,
    and its own outcome is written over the sweep's."""
    dead = arrival_of("acme", "evt_11", 5)
    copy = dataclasses.replace(dead, arrival=new_arrival(), received_at=dead.received_at + 1)
    await arrived(archive_store, dead, copy)
    await record_dead_letter(
        archive_store._database, dataclasses.replace(dead, attempt=3), [failure(1), failure(2), failure(3)]
    )
    await archive_store.settle(0, ROUTES)
    assert await statuses(archive_store, dead.key) == [("dead", 3), ("dead", 0)]
    await archive_store.write_outcomes([archive.outcome_row(copy, archive.PROCESSED, time.time())])
    assert await statuses(archive_store, dead.key) == [("dead", 3), ("processed", 1)]


async def test_a_routed_event_settles_from_its_routes_records(archive_store):
    done, failed = arrival_of("routed", "evt_5", 5), arrival_of("routed", "evt_6", 5)
    await arrived(archive_store, done, failed)
    await completed(archive_store, f"{done.key}#billing", done)
    await completed(archive_store, f"{failed.key}#billing", failed)
    await record_dead_letter(
        archive_store._database,
        dataclasses.replace(failed, key=f"{failed.key}#audit", route="audit", attempt=2),
        [failure(1), failure(2)],
    )
    await archive_store.settle(0, ROUTES)
    assert await statuses(archive_store, done.key) == [("processed", 1)]
    assert await statuses(archive_store, failed.key) == [("dead", 2)]


async def test_a_routes_completion_does_not_settle_the_event_that_shares_its_key(archive_store):
    """Event evt_r's route billing completes under routed:evt_r#billing, the
    key of event evt_r#billing too (docs/design.md, "Routes"): that plain
    event's arrival is not settled by it."""
    event = arrival_of("routed", "evt_r", 5)
    lookalike = dataclasses.replace(arrival_of("routed", "evt_r#billing", 5), payload_sha256=event.payload_sha256)
    await arrived(archive_store, event, lookalike)
    await completed(archive_store, f"{event.key}#billing", event)
    await archive_store.settle(0, ROUTES)
    assert await statuses(archive_store, event.key) == [("processed", 1)]
    assert await statuses(archive_store, lookalike.key) == [("queued", 0)]


async def test_rows_still_on_their_way_are_left_as_they_are(archive_store):
    waiting = arrival_of("acme", "evt_7", 5)  # nothing recorded of it yet: in the queue, or between attempts
    recent = arrival_of("acme", "evt_8", 5)  # completed just now: its outcome batch may be on its way
    young = arrival_of("acme", "evt_9", 0)
    await arrived(archive_store, waiting, recent, young)
    await completed(archive_store, recent.key, recent)
    await completed(archive_store, young.key, young)
    await archive_store._database.execute(
        "UPDATE processed_events SET completed_at = now() - interval '1 hour' WHERE key = $1", young.key
    )
    assert await archive_store.settle(3, ROUTES) == (0, None)  # a 3 s grace: young was received 0 s ago
    assert [await statuses(archive_store, e.key) for e in (waiting, recent, young)] == [[("queued", 0)]] * 3


async def test_a_backlog_of_rows_on_their_way_does_not_hold_the_others_back(archive_store):
    backlog = [arrival_of("acme", f"evt_b{n}", 10) for n in range(5)]  # oldest, nothing recorded
    done = arrival_of("acme", "evt_done", 5)
    await arrived(archive_store, *backlog, done)
    await completed(archive_store, done.key, done)
    settled, after = await archive_store.settle(0, ROUTES, limit=3)
    assert (settled, after is not None) == (0, True)
    settled, after = await archive_store.settle(0, ROUTES, after=after, limit=3)  # the backlog's last two, and done
    assert (settled, after is not None) == (1, True)
    assert await statuses(archive_store, done.key) == [("processed", 1)]
    assert await archive_store.settle(0, ROUTES, after=after, limit=3) == (0, None)  # none left: the round ends


async def test_one_round_of_the_upkeep_reads_on_past_a_backlog(archive_store, monkeypatch):
    """A round reads page after page (SETTLE_PAGES at most): a lost outcome
    behind a backlog of rows on their way is settled the same round."""

    class SmallPages(ArchiveStore):
        async def settle(self, *args, **kwargs):
            return await super().settle(*args, **kwargs, limit=2)

    monkeypatch.setattr(archive_upkeep, "SETTLE_GRACE_SECONDS", 0.0)
    backlog = [arrival_of("acme", f"evt_q{n}", 10) for n in range(5)]
    done = arrival_of("acme", "evt_past_them", 5)
    await arrived(archive_store, *backlog, done)
    await completed(archive_store, done.key, done)
    assert await ArchiveUpkeep(SmallPages(archive_store._database), {}).settle() == 1
    assert await statuses(archive_store, done.key) == [("processed", 1)]


async def test_an_outcome_written_after_the_sweep_read_the_row_wins(archive_store):
    """The sweep writes a row only as it read it: a worker's outcome written in
    between (its batch came through after all) is not overwritten."""
    event = arrival_of("acme", "evt_10", 5)
    await arrived(archive_store, event)
    await completed(archive_store, event.key, event)
    rows = await archive_store._database.fetch(
        "SELECT source, key, received_at, arrival, 'queued' AS was, 0 AS was_attempts, 'duplicate' AS status,"
        " 1 AS attempts, NULL::timestamptz AS completed_at, replay_of FROM event_archive WHERE key = $1",
        event.key,
    )
    await archive_store.write_outcomes(
        [archive.outcome_row(dataclasses.replace(event, attempt=2), archive.PROCESSED, time.time())]
    )
    await archive_store._database.execute(
        SQL["archive_settle"],
        *archive.columns([tuple(row.values()) for row in rows]),
        rows[0]["received_at"],
        rows[0]["received_at"],
    )
    assert await statuses(archive_store, event.key) == [("processed", 2)]


async def test_a_replayed_event_whose_outcome_was_lost_is_settled_by_the_sweep(archive_store, settings):
    """The attacker's case: the event went dead (archived dead), on-call
    replayed its dead letter, the replay completed, and the worker was killed
    before writing that outcome. The arrival must not say `dead` for good."""
    event = arrival_of("acme", "evt_12", 5)
    await arrived(archive_store, event)
    failed = dataclasses.replace(event, attempt=2)
    await archive_store.write_outcomes([archive.outcome_row(failed, archive.DEAD, time.time(), "RuntimeError: 500")])
    dead_letter = await record_dead_letter(archive_store._database, failed, [failure(1), failure(2)])
    replayed = await asyncio.to_thread(CliRunner().invoke, main, ["dlq", "replay", str(dead_letter)])
    assert replayed.exit_code == 0, replayed.output
    assert await statuses(archive_store, event.key) == [("queued", 0)]  # queued again, in the replay's chain
    await completed(archive_store, event.key, event)  # the replay's run; its outcome batch died with its worker
    await archive_store.settle(0, ROUTES)
    assert await statuses(archive_store, event.key) == [("processed", 1)]


async def _two_arrivals(archive_store, event_id: str):
    first = arrival_of("acme", event_id, 5)
    second = dataclasses.replace(first, arrival=new_arrival(), received_at=first.received_at + 1)
    await arrived(archive_store, first, second)
    return first, second


async def _died(archive_store, arrival) -> int:
    """The arrival's run failed for good: its outcome `dead`, and the dead letter it found or opened."""
    died = dataclasses.replace(arrival, attempt=1)
    await archive_store.write_outcomes([archive.outcome_row(died, archive.DEAD, time.time(), "PermanentError")])
    return await record_dead_letter(archive_store._database, died, [failure(1)])


async def _replayed_to_completion(archive_store, dead_letter: int, arrival) -> list[tuple]:
    """On-call's `dlq replay` of the dead letter, and the run it queued for `arrival`, completed."""
    replayed = await asyncio.to_thread(CliRunner().invoke, main, ["dlq", "replay", str(dead_letter)])
    assert replayed.exit_code == 0, replayed.output
    replay_of = await archive_store._database.fetchval(
        "SELECT replay_of FROM event_archive WHERE arrival = $1", arrival.arrival
    )
    run = dataclasses.replace(arrival, replay_of=replay_of, attempt=1)
    await ran(archive_store, run)
    return [archive.outcome_row(run, archive.PROCESSED, time.time())]


async def test_copies_that_died_into_one_dead_letter_follow_its_replay(archive_store, settings):
    """CI's chaos run of seed 7 (evt_00117): two copies of an event told to
    fail both ran and died; the second found the first's dead letter open
    (one per event) and was noted `dead` under it. On-call replayed that dead
    letter and the event completed, yet the second copy's row said `dead`
    with no dead letter open. The replay stands for every arrival its dead
    letter does: each ends as a copy of the replay's run."""
    first, second = await _two_arrivals(archive_store, "evt_14")
    for copy in (first, second):
        dead_letter = await _died(archive_store, copy)
    assert await statuses(archive_store, first.key) == [("dead", 1), ("dead", 1)]
    await archive_store.write_outcomes(await _replayed_to_completion(archive_store, dead_letter, first))
    await archive_store.settle(0, ROUTES)
    assert [status for status, _ in await statuses(archive_store, first.key)] == ["processed", "duplicate"]


async def test_a_copy_settled_dead_while_queued_follows_the_replay(archive_store, settings):
    """evt_00117 as CI's chaos run had it (reproduced with its database
    kept): the third copy, still in the queue when its event went dead, was
    settled `dead` by the sweep from the first copy's open dead letter. The
    bulk replay ran the event to completion, the copy's message then found
    it completed, and its `duplicate` could not step over `dead`."""
    first, copy = await _two_arrivals(archive_store, "evt_16")
    dead_letter = await _died(archive_store, first)
    await archive_store.settle(0, ROUTES)
    assert await statuses(archive_store, first.key) == [("dead", 1), ("dead", 0)]
    processed = await _replayed_to_completion(archive_store, dead_letter, first)
    await archive_store.write_outcomes([*processed, archive.outcome_row(copy, archive.DUPLICATE, time.time())])
    await archive_store.settle(0, ROUTES)
    assert [status for status, _ in await statuses(archive_store, first.key)] == ["processed", "duplicate"]


async def test_copies_that_died_into_one_dead_letter_follow_its_discard(archive_store, settings):
    """The same two copies, their dead letter discarded: both arrivals are
    `discarded`, none left `dead` with no dead letter open."""
    first, second = await _two_arrivals(archive_store, "evt_15")
    for copy in (first, second):
        dead_letter = await _died(archive_store, copy)
    discarded = await asyncio.to_thread(CliRunner().invoke, main, ["dlq", "discard", str(dead_letter)])
    assert discarded.exit_code == 0, discarded.output
    assert [status for status, _ in await statuses(archive_store, first.key)] == ["discarded", "discarded"]


async def test_a_replayed_dead_letter_carries_its_arrival(archive_store, settings):
    """The replay publishes the event as it arrived, its arrival's id too:
    its outcomes are written over the arrival's own row."""
    event = arrival_of("acme", "evt_13", 5)
    dead_letter = await record_dead_letter(archive_store._database, event, [failure(1)])
    replayed = await asyncio.to_thread(CliRunner().invoke, main, ["dlq", "replay", str(dead_letter)])
    assert replayed.exit_code == 0, replayed.output
    [queued] = await queued_events(settings.amqp_url, settings.namespace)
    assert (queued.key, queued.arrival) == (event.key, event.arrival)


async def test_every_process_s_upkeep_sweeps_on_its_own(archive_store, database, monkeypatch):
    """The upkeep's loop (every ingress process and worker runs it) sweeps
    once its tables are kept, and again every SETTLE_EVERY_SECONDS."""
    monkeypatch.setattr(archive_upkeep, "SETTLE_GRACE_SECONDS", 0.0)
    monkeypatch.setattr(archive_upkeep, "SETTLE_EVERY_SECONDS", 0.05)
    first, later = arrival_of("acme", "evt_14", 5), arrival_of("acme", "evt_15", 5)
    await arrived(archive_store, first, later)
    await completed(archive_store, first.key, first)
    own = await asyncpg.connect(database)  # the upkeep's, as a process's archive pool is its own
    upkeep = ArchiveUpkeep(
        ArchiveStore(own), {"acme": parse_source("acme", {"scheme": "github", "secrets": ["s"], "handler": "inbox"})}
    )
    running = asyncio.create_task(upkeep.run())
    try:
        await wait_until(lambda: _is(archive_store, first.key, [("processed", 1)]), 10, message="the first row settled")
        await completed(archive_store, later.key, later)
        await wait_until(
            lambda: _is(archive_store, later.key, [("processed", 1)]), 10, message="a later round settled the next"
        )
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await own.close()


async def _is(archive_store, key: str, expected: list) -> bool:
    return await statuses(archive_store, key) == expected


async def test_two_messages_of_one_arrival_archive_the_run_whichever_outcome_lands_first(archive_store):
    """The ingress gave up on a publish and stored the event in the outbox;
    the broker confirmed the publish late (docs/design.md, "The outbox"): two
    messages of one arrival. One runs, the other is settled as its copy, and
    the two workers' batches land in either order."""
    event = arrival_of("acme", "evt_16", 5)
    await arrived(archive_store, event)
    await ran(archive_store, event)  # the run's completion, which names its arrival
    at = time.time()
    await archive_store.write_outcomes([archive.outcome_row(event, archive.DUPLICATE, at)])  # the copy's batch first
    await archive_store.write_outcomes([archive.outcome_row(event, archive.PROCESSED, at)])
    assert await statuses(archive_store, event.key) == [("processed", 1)]


async def test_the_sweep_names_the_arrival_that_ran(archive_store):
    """A copy's message can run before the first arrival's (the first went
    through the outbox, or was deferred): the completion the worker writes
    says which arrival it was, and the sweep settles that one `processed`."""
    first = arrival_of("acme", "evt_17", 5)
    copy = dataclasses.replace(first, arrival=new_arrival(), received_at=first.received_at + 1)
    await arrived(archive_store, first, copy)
    completions = CompletionStore(archive_store._database)
    leases = await completions.take_leases(archive_store._database, [copy.key], 5000)
    assert await completions.complete_event(archive_store._database, copy, leases[copy.key].token)  # the copy ran
    await archive_store.settle(0, ROUTES)
    assert await statuses(archive_store, first.key) == [("duplicate", 1), ("processed", 1)]


async def test_every_completion_names_its_arrival_and_one_without_none(archive_store):
    """complete_event and complete_events (a batch, ctx.db's transaction and
    the handlers without one) record the arrival their message carried;
    a message queued before arrivals had ids (arrival 0) names none."""
    single, batched, unnamed = (arrival_of("acme", f"evt_a{n}", 5) for n in range(3))
    unnamed = dataclasses.replace(unnamed, arrival=0)
    completions = CompletionStore(archive_store._database)
    leases = await completions.take_leases(archive_store._database, [e.key for e in (single, batched, unnamed)], 5000)
    assert await completions.complete_event(archive_store._database, single, leases[single.key].token)
    assert (
        await completions.complete_events(
            archive_store._database, [(e, leases[e.key].token) for e in (batched, unnamed)]
        )
        == 2
    )
    named = dict(await archive_store._database.fetch("SELECT key, arrival FROM processed_events"))
    assert named == {single.key: single.arrival, batched.key: batched.arrival, unnamed.key: None}


async def test_a_completion_that_names_no_arrival_leaves_the_sweep_its_guess(archive_store):
    """A previous release's worker (or a message without an arrival id)
    completes without naming the arrival: the oldest is settled processed."""
    first = arrival_of("acme", "evt_18", 5)
    copy = dataclasses.replace(first, arrival=new_arrival(), received_at=first.received_at + 1)
    await arrived(archive_store, first, copy)
    await completed(archive_store, copy.key, copy)  # as the previous release's complete_event: no arrival column
    await archive_store.settle(0, ROUTES)
    assert await statuses(archive_store, first.key) == [("processed", 1), ("duplicate", 1)]


async def test_routes_that_ran_from_different_copies_each_name_theirs(archive_store):
    """Two copies of a routed event, each fanned out: route billing ran from
    the first's message, route audit from the copy's. Both arrivals ran a
    route, as their live outcomes would have said."""
    first = arrival_of("routed", "evt_19", 5)
    copy = dataclasses.replace(first, arrival=new_arrival(), received_at=first.received_at + 1)
    third = dataclasses.replace(first, arrival=new_arrival(), received_at=first.received_at + 2)
    await arrived(archive_store, first, copy, third)
    await ran(
        archive_store,
        dataclasses.replace(first, key=f"{first.key}#billing", route="billing"),
        dataclasses.replace(copy, key=f"{first.key}#audit", route="audit"),
    )
    await archive_store.settle(0, ROUTES)
    assert await statuses(archive_store, first.key) == [("processed", 1), ("processed", 1), ("duplicate", 1)]


async def test_a_copy_that_runs_again_after_prune_is_settled_processed(archive_store):
    """The first arrival ran and is archived processed; `prune` forgot its
    completion, so a copy sent days later runs again (docs/reference.md
    §2), and its worker is killed before its outcome batch. Two runs: the
    sweep must not call the second a duplicate of the first."""
    first = arrival_of("acme", "evt_20", 50)
    later = arrival_of("acme", "evt_20", 5)
    await arrived(archive_store, first, later)
    await archive_store.write_outcomes([archive.outcome_row(first, archive.PROCESSED, time.time())])
    await ran(archive_store, later)  # the first's completion is pruned; the copy runs
    await archive_store.settle(0, ROUTES)
    assert await statuses(archive_store, first.key) == [("processed", 1), ("processed", 1)]


async def test_two_messages_of_one_arrival_archive_its_dead_letter_whichever_lands_first(archive_store):
    """Two messages of one arrival (the outbox's twin of a publish confirmed
    late): the first dies at attempt 1 (a PermanentError), the second is a
    copy of that attempt, handed on. The copy's batch lands first."""
    event = arrival_of("acme", "evt_21", 5)
    await arrived(archive_store, event)
    await record_dead_letter(archive_store._database, event, [failure(1)])
    at = time.time()
    await archive_store.write_outcomes([archive.outcome_row(event, archive.DUPLICATE, at)])  # the twin's, handed on
    await archive_store.write_outcomes([archive.outcome_row(event, archive.DEAD, at, "PermanentError: no")])
    assert await statuses(archive_store, event.key) == [("dead", 1)]


async def test_a_route_s_twin_outcome_landing_first_does_not_hide_its_run(archive_store):
    """A worker killed between its fan-out's confirms and its ack: the event
    comes back and is fanned out again, two messages of route billing for
    one arrival. One runs, the other is its duplicate, landing first."""
    event = arrival_of("routed", "evt_22", 5)
    await arrived(archive_store, event)
    billing = dataclasses.replace(event, key=f"{event.key}#billing", route="billing")
    await ran(archive_store, billing)
    as_noted = dataclasses.replace(billing, key=event.key)  # the worker's note: the event's own row, route kept
    at = time.time()
    await archive_store.write_outcomes([archive.outcome_row(as_noted, archive.DUPLICATE, at)])
    await archive_store.write_outcomes([archive.outcome_row(as_noted, archive.PROCESSED, at)])
    assert await statuses(archive_store, event.key) == [("processed", 1)]


async def test_a_late_processed_never_makes_a_second_over_the_sweep_s_guess(archive_store):
    """A completion that names no arrival (the previous release's worker)
    leaves the sweep its guess: the oldest processed, the copy duplicate.
    Were the copy the one that ran, its outcome batch coming through late
    stays out: one run, one `processed`."""
    first = arrival_of("acme", "evt_23", 5)
    copy = dataclasses.replace(first, arrival=new_arrival(), received_at=first.received_at + 1)
    await arrived(archive_store, first, copy)
    await completed(archive_store, copy.key, copy)
    await archive_store.settle(0, ROUTES)
    await archive_store.write_outcomes([archive.outcome_row(copy, archive.PROCESSED, time.time())])
    assert await statuses(archive_store, first.key) == [("processed", 1), ("duplicate", 1)]


async def test_a_late_processed_never_makes_a_second_over_the_previous_release_s_guess(archive_store):
    """During an upgrade the previous release's processes still sweep, and
    guess the oldest arrival though the completion names the copy. The
    copy's own batch, held past the grace, comes through late: it stays out
    (the completion is older than any sweep's grace), one run, one
    `processed`."""
    first = arrival_of("acme", "evt_24", 200)
    copy = dataclasses.replace(first, arrival=new_arrival(), received_at=first.received_at + 1)
    await arrived(archive_store, first, copy)
    await ran(archive_store, copy)
    await archive_store._database.execute("UPDATE processed_events SET completed_at = now() - interval '2 minutes'")
    # the previous release's sweep, its guess: the oldest processed, the copy not
    await archive_store._database.execute(
        "UPDATE event_archive SET status = CASE WHEN arrival = $1 THEN 'processed' ELSE 'duplicate' END, attempts = 1"
        " WHERE key = $2",
        first.arrival,
        first.key,
    )
    await archive_store.write_outcomes([archive.outcome_row(copy, archive.PROCESSED, time.time())])
    assert await statuses(archive_store, first.key) == [("processed", 1), ("duplicate", 1)]


async def test_a_run_whose_batch_died_is_not_left_a_duplicate_of_itself(archive_store):
    """Two messages of one arrival (the outbox's twin of a publish confirmed
    late): the first runs and completes, and its worker is SIGKILLed before
    its outcome batch; the twin, settled as a copy, writes `duplicate` over
    the arrival. The sweep must still say the arrival ran."""
    event = arrival_of("acme", "evt_25", 5)
    await arrived(archive_store, event)
    await ran(archive_store, event)  # its `processed` died with the worker
    await archive_store.write_outcomes([archive.outcome_row(event, archive.DUPLICATE, time.time())])  # the twin's
    await archive_store.settle(0, ROUTES)
    assert await statuses(archive_store, event.key) == [("processed", 1)]


async def test_a_lost_outcome_among_rows_of_one_millisecond_is_not_skipped(archive_store):
    """A burst the ingress stamped with one millisecond: rows still on their
    way fill a page, and a lost outcome of the same millisecond is behind
    them. Every round starts again from the oldest and must reach it."""
    first = arrival_of("acme", "evt_m0", 10)
    waiting, done = (
        dataclasses.replace(arrival_of("acme", name, 10), received_at=first.received_at)
        for name in ("evt_m1", "evt_m_done")
    )
    await arrived(archive_store, first, waiting, done)  # nothing recorded of the first two: on their way
    await completed(archive_store, done.key, done)
    after = None
    for _ in range(4):  # two rounds of pages of 2
        _, after = await archive_store.settle(0, ROUTES, after=after, limit=2)
    assert await statuses(archive_store, done.key) == [("processed", 1)]


# The archive across a `prune` (issue 35, finding 5), in real Postgres: the
# real completion SQL (a lease, complete_events), the real prune
# (CompletionStore.prune), the real outcome batches and the real sweep.
#
# `make chaos SEED=7`'s `chaos:evt_00741: 2 effects, archived 1 conflict, 1
# processed`: event evt completed with payload A, prune forgot it, and
# arrival B (another payload) reached two workers as twin messages. One
# still found A's completion (Redis remembers a completed key past a prune,
# docs/reference.md §2) and noted B a `conflict`; the other ran B, which
# completed naming arrival B. B's own run is its end: `processed`.

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


# Attacks on a dead letter's replay and discard covering the copies it
# holds (25c0a7d: `archive_replayed` and `archive_discarded` reach every
# arrival of the event and payload archived `dead`). Each sequence ends with
# the sweep (grace 0) and asks whether every arrival's row says what became
# of its event for good.


async def _copies(archive_store, source: str, event_id: str, count: int = 2):
    first = arrival_of(source, event_id, 50)
    copies = [first] + [
        dataclasses.replace(first, arrival=new_arrival(), received_at=first.received_at + n) for n in range(1, count)
    ]
    await arrived(archive_store, *copies)
    return copies


def _run(arrival, route: str = "", replay_of: int = 0, attempt: int = 1):
    run = dataclasses.replace(arrival, replay_of=replay_of, attempt=attempt)
    return dataclasses.replace(run, key=f"{arrival.key}#{route}", route=route) if route else run


def _noted(run):
    """The worker's note of a run: a route's on its event's own row, route kept (workers/claim/archive_notes.py)."""
    return dataclasses.replace(run, key=run.key.removesuffix(f"#{run.route}")) if run.route else run


async def _run_died(archive_store, run) -> int:
    """The run failed for good: the dead letter it opened or found open, then its `dead` note."""
    dead_letter = await record_dead_letter(
        archive_store._database, run, [failure(n) for n in range(1, run.attempt + 1)]
    )
    await archive_store.write_outcomes([archive.outcome_row(_noted(run), archive.DEAD, time.time(), "PermanentError")])
    return dead_letter


async def _processed(archive_store, run) -> None:
    """The run completed (naming its arrival) and its note came through."""
    await ran(archive_store, run)
    await archive_store.write_outcomes([archive.outcome_row(_noted(run), archive.PROCESSED, time.time())])


async def _dlq(*args: str) -> None:
    result = await asyncio.to_thread(CliRunner().invoke, main, ["dlq", *args])
    assert result.exit_code == 0, result.output


async def _replay(archive_store, dead_letter: int) -> int:
    """`dlq replay ID`; the replay's chain."""
    await _dlq("replay", str(dead_letter))
    return await archive_store._database.fetchval(
        "SELECT max(id) FROM dead_letter_replays WHERE dead_letter_id = $1", dead_letter
    )


async def _named(archive_store, key: str) -> list[str]:
    return [status for status, _ in await statuses(archive_store, key)]


# -- routes: one arrival, a dead letter per route (KEY#ROUTE) ------------------


async def test_a_copy_follows_a_routes_replay_after_another_routes_discard(archive_store, settings):
    """Two copies of a routed event, each dead on both routes (billing, audit):
    on-call discards audit's dead letter, then replays billing's, which
    completes. The two arrivals lived the same life; the first ends
    `processed` (billing's replay ran it), the copy `discarded` for good
    (the sweep would say `duplicate`: billing's completion, audit's discard)."""
    first, copy = await _copies(archive_store, "routed", "evt_ra")
    for arrival in (first, copy):
        billing = await _run_died(archive_store, _run(arrival, "billing"))
        audit = await _run_died(archive_store, _run(arrival, "audit"))
    await _dlq("discard", str(audit))  # billing's dead letter still open: both rows say `discarded` already
    chain = await _replay(archive_store, billing)
    await _processed(archive_store, _run(first, "billing", chain))
    await archive_store.settle(0, ROUTES)
    assert await _named(archive_store, first.key) == ["processed", "duplicate"]


@pytest.mark.xfail(
    strict=True,
    reason="a sweep round while a route's replay waits settles its requeued arrival from another route's "
    "discarded dead letter, at that one's attempts: the replay's run cannot step over it",
)
async def test_a_routes_replay_is_not_hidden_by_a_sweep_while_it_waits(archive_store, settings):
    """Pre-existing (the arrival a dead letter names, requeued before 25c0a7d
    too). A routed event dead on both routes after 3 attempts; audit's dead
    letter discarded, billing's replayed. A sweep round (every 60 s) while
    billing's replay waits in the queue reads the row `queued`, finds audit's
    discarded dead letter, its own, and settles it `discarded` at attempt 3
    in the replay's chain; the replay's `processed` at attempt 1 is no step
    on. Without that round the row ends `processed`."""
    (event,) = await _copies(archive_store, "routed", "evt_rb", 1)
    audit = await _run_died(archive_store, _run(event, "audit", attempt=3))
    billing = await _run_died(archive_store, _run(event, "billing", attempt=3))
    await _dlq("discard", str(audit))
    chain = await _replay(archive_store, billing)
    await archive_store.settle(0, ROUTES)  # a round while the replay's message waits
    await _processed(archive_store, _run(event, "billing", chain))
    await archive_store.settle(0, ROUTES)
    assert await _named(archive_store, event.key) == ["processed"]  # is: discarded


@pytest.mark.xfail(
    strict=True,
    reason="a bulk replay of both routes' dead letters leaves the arrival in the later chain: the earlier "
    "chain's route dying again is not noted, the row says processed beside an open dead letter",
)
async def test_a_bulk_replay_of_two_routes_shows_the_route_that_died_again(archive_store, settings):
    """Pre-existing (the arrival named). `dlq replay --all` of an event's two
    route dead letters: billing's replay is chain 1, audit's chain 2, and the
    arrival is requeued in both, ending in chain 2. Billing dies again after
    3 attempts (a new open dead letter), audit completes at its first:
    billing's `dead` (chain 1) is no step over chain 2, audit's `processed`
    is, and the row says `processed` with billing's dead letter open —
    docs/design.md, "A routed event in the archive": `dead` when a route was dead-lettered after
    more attempts than the others completed in (the sweep's rule too). Its
    copy, left in chain 1, is settled `dead`."""
    first, copy = await _copies(archive_store, "routed", "evt_rc")
    for arrival in (first, copy):
        billing = await _run_died(archive_store, _run(arrival, "billing"))
        audit = await _run_died(archive_store, _run(arrival, "audit"))
    await _dlq("replay", "--all")
    chains = dict(await archive_store._database.fetch("SELECT dead_letter_id, id FROM dead_letter_replays"))
    await _run_died(archive_store, _run(first, "billing", chains[billing], attempt=3))
    await _processed(archive_store, _run(first, "audit", chains[audit]))
    await archive_store.settle(0, ROUTES)
    assert await _named(archive_store, first.key) == ["dead", "dead"]  # is: processed, dead


# -- one handler ---------------------------------------------------------------


@pytest.mark.xfail(
    strict=True,
    reason="a sweep round while the replay waits settles its requeued rows `dead` from the payload's earlier "
    "discarded dead letter; the replay's run cannot step over it, its copies are never read again",
)
async def test_a_replay_beside_an_earlier_discard_is_not_settled_dead_while_it_waits(archive_store, settings):
    """The event died and its dead letter was discarded; the provider sent it
    again (it starts afresh, docs/reference.md §8), and two copies died into a
    new dead letter, which on-call replays. A sweep round while the replay's
    message waits in the queue reads both rows `queued` in its chain, finds
    no open dead letter and the discarded one, not theirs: `dead`, at its
    attempts. The replay completes: the arrival it ran says `dead` (its
    `processed` at that attempt is no step on) and so does the copy, with no
    dead letter open (without that round: processed, duplicate)."""
    discarded, first, copy = await _copies(archive_store, "acme", "evt_sa", 3)
    await _dlq("discard", str(await _run_died(archive_store, _run(discarded))))
    for arrival in (first, copy):
        dead_letter = await _run_died(archive_store, _run(arrival))
    chain = await _replay(archive_store, dead_letter)
    await archive_store.settle(0, ROUTES)  # a round while the replay's message waits
    await _processed(archive_store, _run(first, replay_of=chain))
    await archive_store.settle(0, ROUTES)
    assert await _named(archive_store, first.key) == ["discarded", "processed", "duplicate"]  # is: ..., dead, dead


@pytest.mark.xfail(
    strict=True,
    reason="a copy the replay requeued is left `queued` when the replay dies again; the new dead letter's "
    "discard reaches only `dead` rows, and the sweep then settles the copy `dead`",
)
async def test_a_copy_follows_the_discard_of_its_replays_new_dead_letter(archive_store, settings):
    """Two copies died into one dead letter; on-call replays it, the replay
    dies again (a new dead letter, naming the first arrival) and on-call
    discards that one before a sweep round has settled the copy (within the
    grace, 60 s, of the new dead letter, or a round's 60 s): the first says
    `discarded`, the copy `dead`, with no dead letter open. A round before
    the discard would have made both `discarded`."""
    first, copy = await _copies(archive_store, "acme", "evt_sb")
    for arrival in (first, copy):
        dead_letter = await _run_died(archive_store, _run(arrival))
    chain = await _replay(archive_store, dead_letter)
    again = await _run_died(archive_store, _run(first, replay_of=chain))
    await _dlq("discard", str(again))
    await archive_store.settle(0, ROUTES)
    assert await _named(archive_store, first.key) == ["discarded", "discarded"]  # is: discarded, dead


async def test_discarding_a_closed_dead_letter_leaves_the_open_ones_copies(archive_store, settings):
    """`dlq discard ID` takes a dead letter of any status. The event's first
    dead letter was discarded; sent again, two copies died into a new one.
    The old one discarded again (a command run twice, a list of ids) makes
    both copies `discarded` though their dead letter is open; that one's
    replay then requeues only the arrival it names, and the copy says
    `discarded` for good beside the processed event."""
    discarded, first, copy = await _copies(archive_store, "acme", "evt_sc", 3)
    old = await _run_died(archive_store, _run(discarded))
    await _dlq("discard", str(old))
    for arrival in (first, copy):
        dead_letter = await _run_died(archive_store, _run(arrival))
    await _dlq("discard", str(old))
    chain = await _replay(archive_store, dead_letter)
    await _processed(archive_store, _run(first, replay_of=chain))
    await archive_store.settle(0, ROUTES)
    assert await _named(archive_store, first.key) == ["discarded", "processed", "duplicate"]


@pytest.mark.xfail(
    strict=True,
    reason="documented as left (docs/design.md, \"The settling sweep\"): a copy's `dead` note still in its worker's "
    "batch when the replay commits lands after it and says `dead` for good",
)
async def test_a_copy_whose_dead_note_lands_after_the_replay(archive_store, settings):
    """The copy found the dead letter open and died into it; its `dead` note
    waits in its worker's batch (flushed every 2 s, longer while Postgres is
    slow) as on-call replays. The replay finds the copy's row `queued`,
    leaves it in chain 0, and the note then steps over it."""
    first, copy = await _copies(archive_store, "acme", "evt_sd")
    dead_letter = await _run_died(archive_store, _run(first))
    assert await record_dead_letter(archive_store._database, _run(copy), [failure(1)]) == dead_letter
    chain = await _replay(archive_store, dead_letter)
    await archive_store.write_outcomes([archive.outcome_row(_run(copy), archive.DEAD, time.time(), "PermanentError")])
    await _processed(archive_store, _run(first, replay_of=chain))
    await archive_store.settle(0, ROUTES)
    assert await _named(archive_store, first.key) == ["processed", "duplicate"]  # is: processed, dead


async def test_a_copy_settled_dead_again_keeps_the_attempts_it_ran(archive_store, settings):
    """Two copies died after 3 attempts each; the replay died again. The
    named arrival says dead at 3; the copy, which ran 3 attempts, says dead at
    0 — as a copy still in the queue when its event died, which never ran."""
    first, copy = await _copies(archive_store, "acme", "evt_se")
    for arrival in (first, copy):
        dead_letter = await _run_died(archive_store, _run(arrival, attempt=3))
    chain = await _replay(archive_store, dead_letter)
    await _run_died(archive_store, _run(first, replay_of=chain, attempt=3))
    await archive_store.settle(0, ROUTES)
    assert await statuses(archive_store, first.key) == [("dead", 3), ("dead", 3)]


# The settling sweep against what changes a row between its page's read and
# its settle (ArchiveStore.settle: two statements, shared/archive/settling.py
# deciding in between). Real Postgres; on-call's replay is the real
# `dlq replay`, run at that moment.

NO_ROUTES: dict[str, list[str]] = {}


def _replayed_meanwhile(monkeypatch, dead_letter_id: int) -> None:
    """On-call replays the dead letter once the sweep has read its page, before it settles it."""
    decide = archive_settling.settled

    def settled(rows):
        done = []
        thread = threading.Thread(
            target=lambda: done.append(CliRunner().invoke(main, ["dlq", "replay", str(dead_letter_id)]))
        )
        thread.start()
        thread.join(30)
        assert done and done[0].exit_code == 0, done and done[0].output
        return decide(rows)

    monkeypatch.setattr(archive_settling, "settled", settled)


async def test_a_dead_letter_replayed_while_the_sweep_settles_its_arrival_ends_as_the_replay_does(
    archive_store, settings, monkeypatch
):
    event = arrival_of("acme", "evt_1", 5)
    await arrived(archive_store, event)  # queued: every note of its chain lost with killed workers
    dead_letter = await record_dead_letter(
        archive_store._database, dataclasses.replace(event, attempt=3), [failure(1), failure(2), failure(3)]
    )
    _replayed_meanwhile(monkeypatch, dead_letter)
    await archive_store.settle(0, NO_ROUTES)
    replay_of = await archive_store._database.fetchval("SELECT replay_of FROM event_archive WHERE key = $1", event.key)
    assert replay_of > 0  # the replay's chain
    settled = await statuses(archive_store, event.key)
    # the replay's run completes and its worker writes its outcome
    await archive_store.write_outcomes(
        [
            archive.outcome_row(
                dataclasses.replace(event, replay_of=replay_of, attempt=1), archive.PROCESSED, time.time()
            )
        ]
    )
    assert settled == [("queued", 0)]  # queued again, in the replay's chain, as the replay left it
    assert await statuses(archive_store, event.key) == [("processed", 1)]


async def test_a_lost_outcome_in_another_source_s_table_of_the_same_millisecond_is_not_skipped(archive_store):
    """1c359b8's cursor across sources: rows of one millisecond in two
    sources' day tables, a page of 2 ending in the first source's, the lost
    outcome in the second's. The page after starts at that source's rows."""
    first = arrival_of("acme", "evt_s0", 10)
    waiting = dataclasses.replace(arrival_of("acme", "evt_s1", 10), received_at=first.received_at)
    done = dataclasses.replace(arrival_of("routed", "evt_s2", 10), received_at=first.received_at)
    await arrived(archive_store, first, waiting, done)  # nothing recorded of the first two: on their way
    await archive_store._database.execute(
        "INSERT INTO processed_events (key, source, event_id, payload_sha256, attempts, arrival)"
        " VALUES ($1, $2, $3, $4, 1, $5)",
        done.key,
        done.source,
        done.event_id,
        done.payload_sha256,
        done.arrival,
    )
    settled, after = await archive_store.settle(0, NO_ROUTES, limit=2)
    assert (settled, after is not None) == (0, True)  # the page: acme's two, on their way
    settled, after = await archive_store.settle(0, NO_ROUTES, after=after, limit=2)
    assert (settled, after) == (1, None)
    assert await statuses(archive_store, done.key) == [("processed", 1)]


# Attacks on the archive's truth after 12cf457..1b527e6 (completions name
# their arrival; the sweep and archive_outcomes read it), in real Postgres:
# the real completion SQL (a lease, complete_events), the real record of an
# attempt handed on (record_handed_on, naming its arrival), the real outcome
# batches (ArchiveStore.write_outcomes) and the real sweep (settle).


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


# -- `stale` (migration 0028; docs/design.md, "Ordering keys") ----------------------------
# An ordered event older than its lane's last, under `stale = "skip"`, is
# completed without its handler: its completion says `stale`, and so does
# its arrival's end, as `processed` would.


async def stale_run(archive_store, *runs) -> None:
    await ran(archive_store, *runs)
    await archive_store._database.execute(
        "UPDATE processed_events SET stale = true WHERE key = ANY($1::text[])", [run.key for run in runs]
    )


async def test_a_stale_completion_settles_its_arrival_stale_and_its_copies_duplicate(archive_store):
    first = arrival_of("acme", "evt_s1", 5)
    copy = dataclasses.replace(first, arrival=new_arrival(), received_at=first.received_at + 1)
    await arrived(archive_store, first, copy)
    await stale_run(archive_store, first)
    await archive_store.settle(0, ROUTES)
    assert await statuses(archive_store, first.key) == [("stale", 1), ("duplicate", 1)]
    assert await archive_store.settle(0, ROUTES) == (0, None)


async def test_a_workers_stale_note_is_an_end_a_twins_duplicate_does_not_write_over(archive_store):
    event = arrival_of("acme", "evt_s2", 5)
    await arrived(archive_store, event)
    await stale_run(archive_store, event)
    await archive_store.write_outcomes([archive.outcome_row(event, archive.STALE, time.time())])
    await archive_store.write_outcomes([archive.outcome_row(event, archive.DUPLICATE, time.time())])
    assert await statuses(archive_store, event.key) == [("stale", 1)]
    completed_at = await archive_store._database.fetchval(
        "SELECT completed_at FROM event_archive WHERE key = $1", event.key
    )
    assert completed_at is not None
    assert await archive_store.settle(0, ROUTES) == (0, None)


async def test_prune_settles_a_stale_completion_s_arrival_stale(archive_store):
    event = arrival_of("acme", "evt_s3", 10)
    copy = arrival_of("acme", "evt_s3", 9)
    await arrived(archive_store, event, copy)
    await stale_run(archive_store, event)
    await pruned(archive_store)
    assert await statuses(archive_store, event.key) == [("stale", 1), ("duplicate", 1)]


async def test_the_upkeep_makes_a_stale_run_s_arrival_noted_duplicate_stale(archive_store, monkeypatch):
    """The twin's `duplicate` landed first and the run's own note was lost: the
    completion naming the arrival settles it `stale`, not `processed`."""
    event = arrival_of("acme", "evt_s4", 5)
    await arrived(archive_store, event, status=archive.DUPLICATE)
    await stale_run(archive_store, event)
    await archive_store._database.execute(
        "UPDATE processed_events SET completed_at = now() - interval '10 seconds' WHERE key = $1", event.key
    )
    await upkeep_round(archive_store, monkeypatch)
    assert await statuses(archive_store, event.key) == [("stale", 1)]
