"""workers/claim/coalesced.py: many runs' leases, completion checks and lone
completions share statements, and each run hears what its own statement
would have said."""

import asyncio
import contextlib

from tests.support.events import make_event
from tests.support.in_memory import InMemoryCompletions
from webhook_ingest.workers.claim.coalesced import CoalescedStatements


class CountedCompletions(InMemoryCompletions):
    """Counts the short statements; each takes 10 ms, so a crowd piles up behind them."""

    def __init__(self) -> None:
        super().__init__()
        self.statements = 0

    @contextlib.asynccontextmanager
    async def statement(self):
        self.statements += 1
        await asyncio.sleep(0.01)
        async with super().statement() as session:
            yield session


async def test_a_crowd_of_runs_takes_its_leases_in_a_few_statements():
    completions = CountedCompletions()
    statements = CoalescedStatements(completions, 3000)
    leases = await asyncio.gather(*(statements.take_lease(f"k{n}") for n in range(200)))
    assert [lease.key for lease in leases] == [f"k{n}" for n in range(200)]
    assert len({lease.token for lease in leases}) == 200
    assert completions.statements <= 4


async def test_two_runs_of_one_key_in_one_batch_get_one_lease():
    statements = CoalescedStatements(CountedCompletions(), 3000)
    first, second = await asyncio.gather(statements.take_lease("k"), statements.take_lease("k"))
    assert first is not None and second is None


async def test_a_key_held_elsewhere_is_not_granted_and_the_others_are():
    completions = CountedCompletions()
    completions.hold_lease("held")
    statements = CoalescedStatements(completions, 3000)
    held, free = await asyncio.gather(statements.take_lease("held"), statements.take_lease("free"))
    assert held is None and free is not None


async def test_each_run_hears_whether_its_key_completed():
    completions = CountedCompletions()
    statements = CoalescedStatements(completions, 3000)
    done = make_event("acme", "done")
    lease = await statements.take_lease(done.key)
    assert await statements.complete_alone(done, lease.token)
    answers = await asyncio.gather(statements.completed_sha256(done.key), statements.completed_sha256("acme:open"))
    assert answers == [done.payload_sha256, None]


async def test_only_the_current_token_completes_when_two_runs_of_a_key_share_a_batch():
    completions = CountedCompletions()
    statements = CoalescedStatements(completions, 3000)
    event, other = make_event("acme", "e1"), make_event("acme", "e2")
    stale = await statements.take_lease(event.key)
    await completions.release_leases([stale])
    current = await statements.take_lease(event.key)
    other_lease = await statements.take_lease(other.key)
    answers = await asyncio.gather(
        statements.complete_alone(event, stale.token),
        statements.complete_alone(event, current.token),
        statements.complete_alone(other, other_lease.token),
    )
    assert answers == [False, True, True]
    assert completions.completions[event.key].token == current.token
