"""Attacks on a dead letter's replay and discard covering the copies it
holds (25c0a7d: `archive_replayed` and `archive_discarded` reach every
arrival of the event and payload archived `dead`). Each sequence ends with
the sweep (grace 0) and asks whether every arrival's row says what became
of its event for good."""

import asyncio
import dataclasses
import time

import pytest
from click.testing import CliRunner

from tests.support.archive import arrival_of, arrived, ran, statuses
from tests.support.dead_letters import failure
from webhook_ingest.cli.main import main
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.dead_letters.model import record_dead_letter
from webhook_ingest.shared.event.message import new_arrival

ROUTES = {"routed": ["billing", "audit"]}


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


async def _died(archive_store, run) -> int:
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
        billing = await _died(archive_store, _run(arrival, "billing"))
        audit = await _died(archive_store, _run(arrival, "audit"))
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
    audit = await _died(archive_store, _run(event, "audit", attempt=3))
    billing = await _died(archive_store, _run(event, "billing", attempt=3))
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
        billing = await _died(archive_store, _run(arrival, "billing"))
        audit = await _died(archive_store, _run(arrival, "audit"))
    await _dlq("replay", "--all")
    chains = dict(await archive_store._database.fetch("SELECT dead_letter_id, id FROM dead_letter_replays"))
    await _died(archive_store, _run(first, "billing", chains[billing], attempt=3))
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
    await _dlq("discard", str(await _died(archive_store, _run(discarded))))
    for arrival in (first, copy):
        dead_letter = await _died(archive_store, _run(arrival))
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
        dead_letter = await _died(archive_store, _run(arrival))
    chain = await _replay(archive_store, dead_letter)
    again = await _died(archive_store, _run(first, replay_of=chain))
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
    old = await _died(archive_store, _run(discarded))
    await _dlq("discard", str(old))
    for arrival in (first, copy):
        dead_letter = await _died(archive_store, _run(arrival))
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
    dead_letter = await _died(archive_store, _run(first))
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
        dead_letter = await _died(archive_store, _run(arrival, attempt=3))
    chain = await _replay(archive_store, dead_letter)
    await _died(archive_store, _run(first, replay_of=chain, attempt=3))
    await archive_store.settle(0, ROUTES)
    assert await statuses(archive_store, first.key) == [("dead", 3), ("dead", 3)]
