"""workers/claim/renewals.py: a worker's many leases and locks are renewed in a few
round trips, and each run hears only its own answer (issue 20: 256 runs'
renewals, one statement each on two connections, queued past their
deadlines and ended runs LockLost with nothing failing)."""

import asyncio

from tests.support.in_memory import InMemoryClaims, InMemoryCompletions, Session
from webhook_ingest.workers.claim.renewals import LeaseRenewals, LockRenewals


class CountedCompletions(InMemoryCompletions):
    """Each renewal statement takes 20 ms, as on a loaded server."""

    def __init__(self) -> None:
        super().__init__()
        self.statements = 0

    async def extend_leases(self, leases, ttl_ms):
        self.statements += 1
        await asyncio.sleep(0.02)
        return await super().extend_leases(leases, ttl_ms)


async def test_hundreds_of_runs_renew_their_leases_in_a_few_statements():
    completions = CountedCompletions()
    granted = await completions.take_leases(Session(), [f"k{n}" for n in range(256)], 3000)
    runs = [[lease] for lease in granted.values()]
    renewals = LeaseRenewals(completions, 3000)
    answers = await asyncio.wait_for(asyncio.gather(*(renewals.extend(run) for run in runs)), 5)
    assert answers == [True] * 256
    assert completions.statements <= 4


async def test_a_run_whose_lease_was_taken_over_hears_false_and_only_it():
    completions = CountedCompletions()
    granted = await completions.take_leases(Session(), ["a", "b", "c"], 3000)
    await completions.release_leases([granted["b"]])
    completions.hold_lease("b")  # another run's token now
    renewals = LeaseRenewals(completions, 3000)
    batch_run = [granted["a"], granted["b"]]  # a batch's run holds several leases: all must hold
    answers = await asyncio.gather(renewals.extend(batch_run), renewals.extend([granted["c"]]))
    assert answers == [False, True]


async def test_locks_still_ours_are_renewed_and_a_lost_one_is_not():
    claims = InMemoryClaims()
    mine, lost = (await claims.claim("mine")).lock, (await claims.claim("lost")).lock
    await claims.release(lost)
    renewals = LockRenewals(claims)  # type: ignore[arg-type]
    assert await asyncio.gather(renewals.extend(mine), renewals.extend(lost)) == [True, False]
