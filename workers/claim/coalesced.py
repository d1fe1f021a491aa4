"""A worker's short statements, many runs' in one.

Each run takes its key's lease, checks the key is not completed, and —
when its handler never used `ctx.db` — writes its completion: three
statements, each a round trip and a commit. With hundreds of runs in
flight (a handler that waits on the network), those round trips were most
of a worker's CPU and of Postgres's: a default worker spent 1.80 ms of CPU
per `forward` event against a 300 ms downstream, 0.95 ms with them shared,
and did 572-609 events/s, 857 with them shared (docs/performance.md,
"Handlers that wait on the network").
Statements asked for while one of their kind is being written go together
in the next (shared/db/group_commit.py): a lone run's goes at once, a crowd's
share one.

Each statement treats its keys one by one, so a run's answer is what its
own statement would have said: a lease is granted to a key whose lease is
free (a key asked for twice in one batch — two runs of one key in this
worker — goes to the first asker; the other hears "held", as it would
have a moment later); a completion is written only under the key's
current fencing token, and two completions of one key never share a
statement (each would read the other's insert as its own).
"""

from collections.abc import Sequence
from typing import Any

from webhook_ingest.shared.db import GroupCommit
from webhook_ingest.shared.event import EventMessage

from .lease import Lease
from .ports import CompletionStorePort

WRITERS = (
    2  # per kind of statement; they share the short-statement pool (2 to 4 connections, workers/connection_budget.py)
)
MAX_BATCH = 256

Completion = tuple[EventMessage, int]  # a message, and the fencing token it completes under


class CoalescedStatements:
    def __init__(self, completions: CompletionStorePort[Any], ttl_ms: int):
        self._completions = completions
        self._ttl_ms = ttl_ms
        self._leases: GroupCommit[str, Lease | None] = GroupCommit(self._take_leases, WRITERS, MAX_BATCH)
        self._checks: GroupCommit[str, str | None] = GroupCommit(self._check_completed, WRITERS, MAX_BATCH)
        self._completions_alone: GroupCommit[Completion, bool] = GroupCommit(self._complete_alone, WRITERS, MAX_BATCH)

    async def take_lease(self, key: str) -> Lease | None:
        """The key's lease, or None while another run holds it."""
        return await self._leases.submit(key)

    async def completed_sha256(self, key: str) -> str | None:
        """The payload hash the key completed with; None while it has not."""
        return await self._checks.submit(key)

    async def complete_alone(self, message: EventMessage, token: int) -> bool:
        """The completion of a handler that never used `ctx.db`; False when refused."""
        return bool(await self._completions_alone.submit((message, token)))

    async def _take_leases(self, keys: list[str]) -> list[Lease | None]:
        async with self._completions.statement() as connection:
            granted = await self._completions.take_leases(connection, list(dict.fromkeys(keys)), self._ttl_ms)
        return [granted.pop(key, None) for key in keys]  # popped: a second asker of a key hears "held"

    async def _check_completed(self, keys: list[str]) -> list[str | None]:
        async with self._completions.statement() as connection:
            completed = await self._completions.check_completed(connection, list(set(keys)))
        return [completed.get(key) for key in keys]

    async def _complete_alone(self, batch: list[Completion]) -> list[bool]:
        answers: dict[int, bool] = {}
        # one session for every round: a refused connect then comes before any round committed,
        # so the runs that wait it out (workers/failures/outage.py, when_let_in) ask for nothing done already
        async with self._completions.statement() as connection:
            for indexes in _distinct_keys(batch):
                completed = await self._completions.complete_alone(connection, [batch[i] for i in indexes])
                answers |= {i: batch[i][0].key in completed for i in indexes}
        return [answers[i] for i in range(len(batch))]


def _distinct_keys(batch: Sequence[Completion]) -> list[list[int]]:
    """The batch's indexes in rounds without a key twice, in order."""
    rounds: list[list[int]] = []
    placed: list[set[str]] = []
    for index, (message, _) in enumerate(batch):
        slot = next((n for n, keys in enumerate(placed) if message.key not in keys), len(rounds))
        if slot == len(rounds):
            rounds.append([])
            placed.append(set())
        rounds[slot].append(index)
        placed[slot].add(message.key)
    return rounds
