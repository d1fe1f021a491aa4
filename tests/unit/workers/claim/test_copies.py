"""workers.claim.copies: a copy is settled with its leader only when the leader settled the same payload
and, unless it completed the event, the same attempt of the same chain."""

import asyncio
import dataclasses

import pytest

from tests.support.events import make_event
from webhook_ingest.workers.claim.copies import CopiesInFlight
from webhook_ingest.workers.claim.states import Outcome


@pytest.mark.parametrize(
    "outcome, same_payload, duplicate",
    [
        (Outcome.PROCESSED, True, True),
        (Outcome.DUPLICATE, True, True),
        (Outcome.PROCESSED, False, False),  # a conflict: the state machine records it
        (Outcome.RETRIED, True, True),  # its retry message carries the event: no second chain
        (Outcome.DEAD, True, True),
        (Outcome.DEFERRED, True, False),  # its deferral may be this very message (issue 20): it runs
        (Outcome.RETRIED, False, False),
        (None, True, False),  # the leader crashed or never ran
    ],
)
async def test_a_copy_waits_for_its_leader(outcome, same_payload, duplicate):
    copies = CopiesInFlight()
    first = make_event("acme", "evt_1", {"amount": 1})
    copy = make_event("acme", "evt_1", {"amount": 1 if same_payload else 2})
    copies.lead(first)
    leader = copies.leader(copy.key)
    waiting = asyncio.create_task(copies.completed_for(leader, copy))
    await asyncio.sleep(0)
    assert not waiting.done()
    copies.settle(first, outcome)
    assert await waiting is duplicate
    assert copies.leader(copy.key) is None


@pytest.mark.parametrize("outcome", list(Outcome))
@pytest.mark.parametrize("copy_changes", [{"attempt": 2}, {"replay_of": 7}, {"attempt": 2, "replay_of": 7}])
async def test_another_attempt_or_replay_is_settled_only_by_a_completion(outcome, copy_changes):
    """Adversary finding A1: a stale copy of attempt 1 leads (DUPLICATE: that
    attempt was already handed on); the retry of attempt 2, or a replay,
    waiting behind it must still run."""
    copies = CopiesInFlight()
    first = make_event("acme", "evt_1")
    copy = dataclasses.replace(first, **copy_changes)
    copies.lead(first)
    waiting = asyncio.create_task(copies.completed_for(copies.leader(copy.key), copy))
    copies.settle(first, outcome)
    assert await waiting is (outcome in (Outcome.PROCESSED, Outcome.STALE))  # STALE: completed unrun (issue 38)


async def test_a_leaders_deferral_is_not_settled_as_its_copy():
    """The deferral carries the event: acked as a duplicate, it is lost."""
    copies = CopiesInFlight()
    first = make_event("acme", "evt_1")
    deferral = dataclasses.replace(first, message_id="deferral")  # the same attempt, published by the leader
    copies.lead(first)
    waiting = asyncio.create_task(copies.completed_for(copies.leader(deferral.key), deferral))
    copies.settle(first, Outcome.DEFERRED)
    assert await waiting is False  # it runs (the leader did not complete the event)


async def test_only_the_leader_settles_its_key():
    copies = CopiesInFlight()
    first, copy = make_event("acme", "evt_1"), make_event("acme", "evt_1")
    copies.lead(first)
    copies.settle(copy, Outcome.PROCESSED)  # not the leader: ignored
    assert copies.leader(first.key) is not None
    copies.abandon([first])
    assert copies.leader(first.key) is None
