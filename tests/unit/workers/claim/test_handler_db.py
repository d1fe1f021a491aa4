"""Adversary round 5: the lazy `ctx.db` transaction (workers/claim/handler_db.py)
against the processor, on the in-memory stores (tests/support/in_memory.py)."""

import asyncio
import contextlib
import dataclasses

import pytest

from tests.support.events import make_event
from tests.support.in_memory import InMemoryClaims, InMemoryCompletions, RecordingFailures
from webhook_ingest.shared.sources.model import parse_source
from webhook_ingest.workers.claim.processor import Processor
from webhook_ingest.workers.claim.states import Outcome

RUNS: list[str] = []


async def optional_write(event, ctx):
    """Writes a best-effort row, giving up after 50 ms (say, an audit line)."""
    RUNS.append(event.key)
    try:
        await asyncio.wait_for(ctx.db.execute("INSERT INTO audit ..."), timeout=0.05)
    except TimeoutError:
        pass  # optional: the event is handled without it


LEFT_RUNNING: list[asyncio.Task] = []
KEPT: list[object] = []


async def write_later(event, ctx):
    """Answers at once and leaves its write to a task of its own (fire and forget)."""
    RUNS.append(event.key)

    async def audit():
        await asyncio.sleep(0.01)
        await ctx.db.execute("INSERT INTO audit ...")

    LEFT_RUNNING.append(asyncio.create_task(audit()))
    KEPT.append(ctx.db)  # as asyncpg's pool keeps a connection acquired (in memory, the GC would end it)


async def query_first(event, ctx):
    RUNS.append(event.key)
    await ctx.db.execute("INSERT INTO effects ...")


class SilentServer(InMemoryCompletions):
    """Postgres gone silent (a partition, a stopped server) as asyncpg meets
    it: a statement is never answered, and a rollback after a cancelled one
    waits for the cancellation's answer (shared/db/sessions.py) unless the
    session was closed (terminate), when it fails at once."""

    def __init__(self) -> None:
        super().__init__()
        self.renewals_answer = False  # the renewals go unanswered too: the lease is lost on its timer

    async def take_turn(self, session, key):
        await asyncio.Event().wait()  # never answered
        raise AssertionError("unreachable")

    @contextlib.asynccontextmanager
    async def transaction(self, session):
        try:
            yield
        except BaseException:
            while not session.terminated:  # noqa: ASYNC110 - the rollback waits for the cancelled statement's answer
                await asyncio.sleep(0.05)
            raise


HANDLERS = ("optional_write", "write_later", "query_first")
SOURCES = {
    name: parse_source(
        name, {"scheme": "hmac-sha256", "secrets": ["s"], "handler": f"tests.unit.workers.claim.test_handler_db:{name}"}
    )
    for name in HANDLERS
}


@pytest.fixture
def stores():
    RUNS.clear()
    LEFT_RUNNING.clear()
    KEPT.clear()
    completions = InMemoryCompletions(pool_size=1)  # one handler-transaction session
    claims, failures = InMemoryClaims(300), RecordingFailures()
    return Processor(SOURCES, claims, completions, failures), completions, claims, failures


def event(source: str, event_id: str = "evt_1"):
    return dataclasses.replace(make_event(source, event_id), message_id="m1")


async def test_a_handler_whose_own_timeout_cancels_opening_ctx_db_still_gets_an_outcome(stores):
    processor, completions, _, _ = stores
    message = event("optional_write")
    async with completions.session():  # every handler-transaction session is taken (a busy pool)
        try:
            outcome = await asyncio.wait_for(processor.process(message), 5)
        except asyncio.CancelledError:
            outcome = None  # what the worker's _handle cannot catch: the task ends cancelled
    assert RUNS == [message.key]
    assert outcome is not None, "process() raised CancelledError though nobody cancelled the run"


async def test_ctx_db_used_after_the_handler_returned_is_refused_not_left_open(stores):
    processor, completions, _, _ = stores
    message = event("write_later")
    assert await processor.process(message) is Outcome.PROCESSED  # completed alone: the handler never queried
    results = await asyncio.gather(*LEFT_RUNNING, return_exceptions=True)
    assert completions.turns == {}, "the key's turn is still held by a transaction nobody will end"
    assert isinstance(results[0], Exception), "the write after the run ended was answered as done"


async def test_a_lease_lost_while_ctx_db_takes_its_turn_closes_the_session_and_defers():
    RUNS.clear()
    silent = SilentServer()
    processor = Processor(SOURCES, InMemoryClaims(300), silent, RecordingFailures())
    message = event("query_first")
    # the lease (300 ms) counts as lost after 200 ms; the run must end then, not when Postgres speaks again
    assert await asyncio.wait_for(processor.process(message), 2) is Outcome.DEFERRED
    assert RUNS == [message.key]
