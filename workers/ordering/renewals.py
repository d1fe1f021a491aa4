"""The worker's lane lease renewals, many lanes' in one statement (as
workers/claim/renewals.py does the keys' leases): renewals asked for while
one is being written go together in the next."""

from webhook_ingest.shared.db import GroupCommit

from .store import LaneStore

WRITERS = 1
MAX_BATCH = 1000


class LaneRenewals:
    def __init__(self, store: LaneStore, ttl_ms: int):
        self._store = store
        self._ttl_ms = ttl_ms
        self._batches: GroupCommit[tuple[str, int], bool] = GroupCommit(self._extend, WRITERS, MAX_BATCH)

    async def extend(self, lane: str, token: int) -> bool:
        """True when `token` is still the lane's and its lease now runs a TTL longer."""
        return bool(await self._batches.submit((lane, token)))

    async def _extend(self, lanes: list[tuple[str, int]]) -> list[bool]:
        extended = await self._store.extend(sorted(set(lanes)), self._ttl_ms)
        return [lane in extended for lane in lanes]
