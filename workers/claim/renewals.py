"""A worker's lease and lock renewals, a few round trips at a time.

Every run keeps its Postgres lease and its Redis lock alive every third of
the TTL (workers/claim/lease.py). A worker runs up to `concurrency` handlers at
once (256 by default): one statement and one script call per renewal would
queue behind each other on the two renewal connections, and a renewal that
waits its turn past its deadline ends its run LockLost although nothing
failed (issue 20: a `ctx.db` handler of 300 ms at the defaults). Renewals
asked for while one is being written go together in the next
(shared/db/group_commit.py): a slow Postgres or Redis makes the batches
bigger, not the queue longer, and a lone renewal still goes at once.

Each run learns its own answer: a lease is extended only while its fencing
token is the key's current one, a lock only on a quorum of masters that
still hold our value.
"""

from collections.abc import Sequence
from typing import Any

from webhook_ingest.shared.db import GroupCommit

from .lease import Lease
from .ports import CompletionStorePort, IdempotencyStorePort
from .redlock import Lock

WRITERS = 2  # Redis script calls at once; the lease renewals' follow the renewal pool's connections
MAX_BATCH = 1000


class LeaseRenewals:
    def __init__(self, completions: CompletionStorePort[Any], ttl_ms: int, writers: int = WRITERS):
        """`writers`: the renewal pool's connections, so that no renewal waits
        for a connection (its wait counts against its deadline)."""
        self._completions = completions
        self._ttl_ms = ttl_ms
        self._batches: GroupCommit[tuple[Lease, ...], bool] = GroupCommit(self._extend, writers, MAX_BATCH)

    async def extend(self, leases: Sequence[Lease]) -> bool:
        """True when every one of a run's leases was still ours and now runs a TTL longer."""
        return bool(await self._batches.submit(tuple(leases)))

    async def _extend(self, runs: list[tuple[Lease, ...]]) -> list[bool]:
        extended = await self._completions.extend_leases([lease for run in runs for lease in run], self._ttl_ms)
        return [all((lease.key, lease.token) in extended for lease in run) for run in runs]


class LockRenewals:
    def __init__(self, store: IdempotencyStorePort):
        self._store = store
        self._batches: GroupCommit[Lock, bool] = GroupCommit(self._extend, WRITERS, MAX_BATCH)

    async def extend(self, lock: Lock) -> bool:
        """True when a quorum of masters still held the lock and now keep it a TTL longer."""
        return bool(await self._batches.submit(lock))

    async def _extend(self, locks: list[Lock]) -> list[bool]:
        return [extended is not None for extended in await self._store.extend_many(locks)]
