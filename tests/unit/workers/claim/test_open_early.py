"""An ordered row's `ctx.db` opened as its handler starts (Processor's
OPEN_EARLY_SECONDS, HandlerTransaction.open_early): a hot key's rows wait on
each run's latency, so the session, its transaction and the key's turn are
taken beside the handler's own work, not after it. What must not change:
the turn still refuses a run whose key another run holds, nothing is left
open by a handler that fails first, and a handler that stopped querying
soon opens lazily again. On the in-memory stores (tests/support/in_memory.py)."""

import asyncio
import dataclasses

import orjson
import pytest

from tests.support.events import make_event
from tests.support.in_memory import InMemoryClaims, InMemoryCompletions, RecordingFailures, Session
from webhook_ingest.shared.event import OrderedStep
from webhook_ingest.shared.sources.model import parse_source
from webhook_ingest.workers.claim import processor as claim_processor
from webhook_ingest.workers.claim.processor import Processor
from webhook_ingest.workers.claim.states import Outcome

TURN_HELD_AT_FIRST_QUERY: list[bool] = []  # per run: whether its turn was taken before its first query
COMPLETIONS: list[InMemoryCompletions] = []


async def work_then_write(event, ctx):
    """A fast API call, then a write (the bench's hot-key handler); with
    `{"query": false}` in the body it skips the write, with `{"fail": true}`
    it fails before it."""
    body = orjson.loads(event.body)
    if body.get("fail"):
        raise RuntimeError("the API said no")
    await asyncio.sleep(0.01)
    if body.get("query", True):
        TURN_HELD_AT_FIRST_QUERY.append(event.key in COMPLETIONS[0].turns)
        await ctx.db.execute("INSERT INTO effects ...")


SOURCES = {
    "acme": parse_source(
        "acme",
        {
            "scheme": "hmac-sha256",
            "secrets": ["s"],
            "handler": "tests.unit.workers.claim.test_open_early:work_then_write",
        },
    )
}


@pytest.fixture
def stores(monkeypatch):
    # the handler's first query, 10 ms in, is soon however loaded the host (CI's parallel part)
    monkeypatch.setattr(claim_processor, "OPEN_EARLY_SECONDS", 5.0)
    TURN_HELD_AT_FIRST_QUERY.clear()
    COMPLETIONS.clear()
    completions = InMemoryCompletions(pool_size=1)  # one handler-transaction session: a leaked one hangs the next run
    COMPLETIONS.append(completions)
    return Processor(SOURCES, InMemoryClaims(300), completions, RecordingFailures()), completions


def row(seq: int, **body):
    event = make_event("acme", f"evt_{seq}", {"object": "o1", **body})
    return dataclasses.replace(event, ordered=OrderedStep(lane="acme:o1", seq=seq, token=1, by=None))


async def test_once_a_handler_queried_soon_its_next_rows_turn_is_taken_before_its_first_query(stores):
    processor, completions = stores
    for seq in (1, 2, 3):
        assert await processor.run_ordered(row(seq)) is Outcome.PROCESSED
    assert TURN_HELD_AT_FIRST_QUERY == [False, True, True]
    assert set(completions.completions) == {row(seq).key for seq in (1, 2, 3)}
    assert completions.turns == {}, "a turn outlived its transaction"


async def test_no_more_rows_open_early_at_once_than_the_processor_allows(stores):
    """Many lanes of such a handler would each hold a session through their
    handlers' work: `open_early` (1 here) bounds them, the others open lazily."""
    completions = InMemoryCompletions()  # sessions enough for all: only the bound holds them back
    COMPLETIONS[:] = [completions]
    processor = Processor(SOURCES, InMemoryClaims(300), completions, RecordingFailures(), open_early=1)
    assert await processor.run_ordered(row(1)) is Outcome.PROCESSED
    outcomes = await asyncio.gather(*(processor.run_ordered(row(seq, object=f"o{seq}")) for seq in (2, 3, 4)))
    assert outcomes == [Outcome.PROCESSED] * 3
    assert sorted(TURN_HELD_AT_FIRST_QUERY) == [False, False, False, True]


async def test_a_turn_held_elsewhere_met_by_the_early_opening_defers_the_row_unwritten(stores):
    processor, completions = stores
    assert await processor.run_ordered(row(1)) is Outcome.PROCESSED
    message = row(2)  # refused at its first query
    completions.turns[message.key] = Session()  # another run's transaction holds the key's turn
    assert await processor.run_ordered(message) is Outcome.DEFERRED
    assert message.key not in completions.completions
    del completions.turns[message.key]
    assert completions.turns == {}


async def test_a_turn_refused_early_to_a_handler_that_never_queries_completes_it_alone(stores):
    """Opened at its first query, as before, such a handler never asks for the
    turn: its run completes alone, its calls made once, not deferred to be
    made again (tests/integration/workers/ordering/test_open_early.py)."""
    processor, completions = stores
    assert await processor.run_ordered(row(1)) is Outcome.PROCESSED
    message = row(3, query=False)
    completions.turns[message.key] = Session()
    assert await processor.run_ordered(message) is Outcome.PROCESSED
    assert message.key in completions.completions
    del completions.turns[message.key]
    assert completions.turns == {}


async def test_a_handler_that_fails_before_the_early_opening_is_used_leaves_nothing_open(stores):
    processor, completions = stores
    assert await processor.run_ordered(row(1)) is Outcome.PROCESSED
    assert await processor.run_ordered(row(2, fail=True)) is Outcome.RETRIED
    assert completions.turns == {}
    # the one session went back to the pool: the next run gets it
    assert await asyncio.wait_for(processor.run_ordered(row(3)), 5) is Outcome.PROCESSED


async def test_a_handler_that_stopped_querying_opens_lazily_again(stores):
    processor, completions = stores
    assert await processor.run_ordered(row(1)) is Outcome.PROCESSED
    assert await processor.run_ordered(row(2, query=False)) is Outcome.PROCESSED  # opened early: completed in it
    assert await processor.run_ordered(row(3)) is Outcome.PROCESSED
    assert TURN_HELD_AT_FIRST_QUERY == [False, False]
    assert set(completions.completions) == {row(seq).key for seq in (1, 2, 3)}


class GoesSilent(InMemoryCompletions):
    """Postgres that stops answering after the first run: the turn's statement and the renewals
    go unanswered (as test_handler_db.py's SilentServer, from the second run on)."""

    def __init__(self) -> None:
        super().__init__(pool_size=1)
        self.silent = False

    async def take_turn(self, session, key):
        if self.silent:
            self.renewals_answer = False
            await asyncio.Event().wait()  # never answered
        return await super().take_turn(session, key)


async def test_a_lease_lost_while_the_early_opening_waits_on_its_turn_ends_the_run_and_its_session():
    TURN_HELD_AT_FIRST_QUERY.clear()
    COMPLETIONS.clear()
    silent = GoesSilent()
    COMPLETIONS.append(silent)
    processor = Processor(SOURCES, InMemoryClaims(300), silent, RecordingFailures())
    assert await processor.run_ordered(row(1)) is Outcome.PROCESSED
    silent.silent = True
    # the lease (300 ms) counts as lost after 200 ms: the run ends then, its session given back
    assert await asyncio.wait_for(processor.run_ordered(row(2)), 2) is Outcome.DEFERRED
    async with asyncio.timeout(1):
        async with silent.session():  # the one session is free again
            pass
