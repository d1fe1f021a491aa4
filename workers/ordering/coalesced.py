"""A worker's lane statements, many lanes' in one (as workers/claim/coalesced.py
does the runs' leases, checks and completions): takes, pages and
let-go-if-idle asked for while one of their kind is being written go
together in the next (shared/db/group_commit.py); a lone lane's goes at once.
And the lanes' due heads of batchable handlers, many lanes' in one
transaction (`LaneHeads`: BatchProcessor.run_heads).

With hundreds of lanes held on a short-statement pool of two to four
connections, one statement per lane and step queued the lanes behind one
another; each statement here treats its lanes one by one (locked in lane
order), so a lane's answer is what its own statement would have said.
"""

from collections.abc import Callable
from typing import TypeVar

from webhook_ingest.shared.db import GroupCommit
from webhook_ingest.shared.event import EventMessage
from webhook_ingest.workers.claim import BatchProcessor, Lease, Outcome

from .store import Idle, LaneStore, Page, Taken

WRITERS = 1  # per kind of statement, on the short-statement pool the runs' statements share
MAX_BATCH = 256
HEAD_WRITERS = 2  # transactions at once, as the worker's unordered batches (workers/worker.py, PARALLEL_BATCHES)

PageAsked = tuple[str, int, float]  # lane, token, hold seconds
Asked = TypeVar("Asked", bound=tuple)


class LaneStatements:
    def __init__(self, store: LaneStore, holder: str, ttl_ms: int, page_rows: int):
        self._store = store
        self._holder = holder
        self._ttl_ms = ttl_ms
        self._page_rows = page_rows
        self._takes: GroupCommit[str, Taken | None] = GroupCommit(self._take, WRITERS, MAX_BATCH)
        self._pages: GroupCommit[PageAsked, Page] = GroupCommit(self._page, WRITERS, MAX_BATCH)
        self._idles: GroupCommit[tuple[str, int], Idle] = GroupCommit(self._release_if_idle, WRITERS, MAX_BATCH)

    async def take(self, lane: str) -> Taken | None:
        """The lane's lease and a new token, or None (not runnable, or held)."""
        return await self._takes.submit(lane)

    async def page(self, lane: str, token: int, hold_seconds: float) -> Page:
        page = await self._pages.submit((lane, token, hold_seconds))
        assert page is not None
        return page

    async def release_if_idle(self, lane: str, token: int) -> Idle:
        idle = await self._idles.submit((lane, token))
        assert idle is not None
        return idle

    async def _take(self, lanes: list[str]) -> list[Taken | None]:
        taken = await self._store.take_many(list(dict.fromkeys(lanes)), self._holder, self._ttl_ms)
        return [taken.pop(lane, None) for lane in lanes]  # popped: a second asker of a lane hears "held"

    async def _page(self, asked: list[PageAsked]) -> list[Page]:
        pages: dict[tuple[str, int], Page] = {}
        for distinct in _rounds(asked):  # a lane asked twice (two tokens): each its own answer
            found = await self._store.pages(distinct, self._page_rows)
            pages |= {(lane, token): found[lane] for lane, token, _ in distinct}
        return [pages[(lane, token)] for lane, token, _ in asked]

    async def _release_if_idle(self, asked: list[tuple[str, int]]) -> list[Idle]:
        idles: dict[tuple[str, int], Idle] = {}
        for distinct in _rounds(asked):
            found = await self._store.release_many_if_idle(distinct)
            idles |= {(item[0], item[1]): found[item[0]] for item in distinct}
        return [idles[(item[0], item[1])] for item in asked]


class LaneHeads:
    """Lanes' due heads whose handler is batchable, many lanes' in one
    transaction: those asked for while HEAD_WRITERS batches run go together
    in the next; a lone head goes at once."""

    def __init__(self, batches: BatchProcessor, batchable: Callable[[EventMessage], bool]):
        self.takes = batchable  # whether a row's handler may share the transaction (Processor.batchable)
        self._batches: GroupCommit[tuple[EventMessage, Lease | None], Outcome | None] = GroupCommit(
            batches.run_heads, HEAD_WRITERS, MAX_BATCH
        )

    async def run(self, message: EventMessage, lease: Lease | None) -> Outcome | None:
        """The head's outcome; None: not run here, it goes alone (with `lease`, still ours)."""
        return await self._batches.submit((message, lease))


def _rounds(asked: list[Asked]) -> list[list[Asked]]:
    """`asked` without repeats, in rounds where no lane comes twice."""
    rounds: list[list[Asked]] = []
    placed: list[set[str]] = []
    for item in dict.fromkeys(asked):
        slot = next((n for n, lanes in enumerate(placed) if item[0] not in lanes), len(rounds))
        if slot == len(rounds):
            rounds.append([])
            placed.append(set())
        rounds[slot].append(item)
        placed[slot].add(item[0])
    return rounds
