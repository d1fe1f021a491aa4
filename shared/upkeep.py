"""The upkeep every process runs: the event archive's tables kept, its rows
settled, and the frozen selections of ended replays pruned. Above both the
archive and the replays (a replay by selection reads the archive; the
archive knows nothing of replays), so neither imports the other back.

The event archive's tables, kept: each source's days made ahead and
dropped whole past its `retention`, and the size on disk of each source in
`webhook_archive_bytes` (docs/design.md, "The archive"), which the console's
overview shows as last read (`sizes`): no query of its own per page view.

It also settles the archive (shared/archive/settling.py): every
SETTLE_EVERY_SECONDS up to SETTLE_PAGES pages of the rows still `queued`
or `retrying` whose event Postgres recorded an end of more than
SETTLE_GRACE_SECONDS ago are brought up to that end — what a worker killed
with its outcome batch unwritten left behind. A page starts after the last
one's last row, named whole (a burst of one millisecond is read on, not
skipped), so rows still on their way (a backlog) never hold the others
back.

Each round it also reads the completions committed since its last round
(up to SETTLE_NAMED_PAGES pages, none older than
SETTLE_NAMED_LOOKBACK_SECONDS before the grace) and makes the arrival each
names `processed` where the archive says `duplicate` or `conflict`: a note
written of it before its own run (a `prune`'s, while its message was still
on its way), whose run's note was lost with its worker.

Every ingress process and every worker runs it — at start, then every
KEEP_EVERY_SECONDS — so the archive is kept whichever of them runs;
`event_archive_keep` serialises them per source. Its first round that
succeeds opens the process's archive writer (`ready`), so no row is sent
before its day's table exists. A round that fails (Postgres away, a lock
not granted within its timeout) is logged and tried again, backing off:
tables are made DAYS_AHEAD days ahead, so a day of failures loses nothing.
A source no longer in the sources file is left as it is (another process
may still have it during a rolling deploy).

It prunes the frozen selections of replays by selection
(`event_replay_items`, docs/reference.md §8): every PRUNE_EVERY_SECONDS, at
most PRUNE_STATEMENTS statements of PRUNE_PAGE items, each reading the next
items of a pass over a replay that ended (`done`, `cancelled`) more than
PRUNE_AFTER_SECONDS ago and deleting those whose event has no arrival
archived any more (its days dropped by the retention: its event has no
page); an item still archived is skipped, never holding back the ones
after it, and read again by the replay's next pass, begun no sooner than
PRUNE_AGAIN_SECONDS after the last began. The replay's row, its progress,
stays. Processes at once take different items; an item of a replay that
can still run (prepared, running, failed) is never read.
"""

import asyncio
import time

from webhook_ingest.shared.archive import ArchiveStore, Cursor, NamedCursor
from webhook_ingest.shared.archive import settling as archive_settling
from webhook_ingest.shared.db import raise_if_cancelled
from webhook_ingest.shared.observability import get_logger, metrics
from webhook_ingest.shared.replays import EventReplayStore
from webhook_ingest.shared.sources import Source

from .backoff import pauses
from .errors import describe

log = get_logger(__name__)

KEEP_EVERY_SECONDS = 600.0
SIZES_EVERY_SECONDS = 60.0
SETTLE_EVERY_SECONDS = 60.0  # also how long a row may show an earlier status after its worker was killed
SETTLE_GRACE_SECONDS = archive_settling.GRACE_SECONDS  # an end this recent may still have its outcome batch on its way
SETTLE_PAGES = 20  # of 500 rows a round at most: a backlog of rows on their way is read 10,000 a minute
SETTLE_NAMED_PAGES = 10  # of 2,000 completions a round at most: 20,000 a minute, 330 a second
# completions older than this before the grace are not read: a process's start, or a round
# behind a burst past the pages above, skips on (the other processes' upkeep read them)
SETTLE_NAMED_LOOKBACK_SECONDS = 600.0
PRUNE_EVERY_SECONDS = 60.0
PRUNE_PAGE = 1000  # items a statement reads and deletes at most (~0.1 s with 30 days kept): never a DELETE storm
PRUNE_STATEMENTS = 20  # a round's at most: 20,000 items a minute a process, a million in under an hour
PRUNE_AFTER_SECONDS = 86400.0  # a replay ended this long ago (a runner frozen mid-run still finds its items)
PRUNE_AGAIN_SECONDS = 86400.0  # a replay's items still archived are read again once a day at most


class ArchiveUpkeep:
    def __init__(self, store: ArchiveStore, sources: dict[str, Source]):
        self._store = store
        self._replays = EventReplayStore(store.database)
        self._retentions = {name: source.retention for name, source in sources.items()}  # 0 too: its days go
        self._archived = [name for name, source in sources.items() if source.retention]
        self._routes = {
            name: [route.name for route in source.routes] for name, source in sources.items() if source.routes
        }
        self._settled_to: Cursor | None = None  # the row after which the next page of the sweep starts
        self._named_to: NamedCursor | None = None  # the completion after which settle_named reads on
        self.ready = asyncio.Event()
        self.sizes: dict[str, int] = {}  # the gauge's last reading, for the console's overview

    async def run(self) -> None:
        """Forever; never raises (a stale gauge, a round tried later)."""
        backoff = pauses(1.0, 60.0)
        next_keep = next_settle = next_prune = 0.0
        while True:
            if time.monotonic() >= next_keep:
                kept = await self.keep()
                next_keep = time.monotonic() + (KEEP_EVERY_SECONDS if kept else next(backoff))
                if kept:
                    backoff = pauses(1.0, 60.0)
            await self.refresh_sizes()
            if self.ready.is_set() and time.monotonic() >= next_settle:
                await self.settle()
                next_settle = time.monotonic() + SETTLE_EVERY_SECONDS
            if self.ready.is_set() and time.monotonic() >= next_prune:
                await self.prune()
                next_prune = time.monotonic() + PRUNE_EVERY_SECONDS
            wake = min(next_keep, next_settle, next_prune) if self.ready.is_set() else next_keep
            await asyncio.sleep(max(0.0, min(SIZES_EVERY_SECONDS, wake - time.monotonic())))

    async def keep(self) -> bool:
        """One round over every source; whether it succeeded."""
        try:
            made, dropped = await self._store.keep(self._retentions)
        except Exception as exc:  # noqa: BLE001 - tried again later: days are made well ahead
            raise_if_cancelled()
            log.warning("archive_upkeep_failed", error=describe(exc))
            return False
        if made or dropped:
            log.info("archive_days_kept", made=made, dropped=dropped)
        self.ready.set()
        return True

    async def settle(self) -> int:
        """One round of the settling sweep: pages until the last, at most
        SETTLE_PAGES; rows settled. Never raises (the next round goes on)."""
        settled = 0
        try:
            for _ in range(SETTLE_PAGES):
                page, self._settled_to = await self._store.settle(SETTLE_GRACE_SECONDS, self._routes, self._settled_to)
                settled += page
                if self._settled_to is None:
                    break
        except Exception as exc:  # noqa: BLE001 - a row settled a round later
            raise_if_cancelled()
            log.warning("archive_settle_failed", error=describe(exc))
        settled += await self.settle_named()
        if settled:
            log.info("archive_rows_settled", rows=settled)
        return settled

    async def settle_named(self) -> int:
        """The arrivals that completions committed since the last round name,
        still archived `duplicate` or `conflict`, made `processed`: at most
        SETTLE_NAMED_PAGES pages; rows settled. Never raises."""
        settled = 0
        try:
            for _ in range(SETTLE_NAMED_PAGES):
                page, self._named_to, full = await self._store.settle_named(
                    SETTLE_GRACE_SECONDS, SETTLE_NAMED_LOOKBACK_SECONDS, self._named_to
                )
                settled += page
                if not full:
                    break
        except Exception as exc:  # noqa: BLE001 - read again next round, from the same completion
            raise_if_cancelled()
            log.warning("archive_settle_named_failed", error=describe(exc))
        return settled

    async def prune(self) -> int:
        """One round of pruning the items of ended replays: at most
        PRUNE_STATEMENTS statements, a replay's until its pass is over;
        items deleted. Never raises (the next round goes on)."""
        pruned = statements = 0
        try:
            for replay_id in await self._replays.to_prune(PRUNE_AFTER_SECONDS, PRUNE_STATEMENTS, PRUNE_AGAIN_SECONDS):
                more = True
                while more and statements < PRUNE_STATEMENTS:
                    deleted, more = await self._replays.prune(
                        replay_id, PRUNE_AFTER_SECONDS, PRUNE_PAGE, PRUNE_AGAIN_SECONDS
                    )
                    pruned, statements = pruned + deleted, statements + 1
                if statements >= PRUNE_STATEMENTS:
                    break
        except Exception as exc:  # noqa: BLE001 - pruned a round later
            raise_if_cancelled()
            log.warning("event_replay_prune_failed", error=describe(exc))
        if pruned:
            log.info("event_replay_items_pruned", items=pruned)
        return pruned

    async def refresh_sizes(self) -> None:
        if not self._archived:
            return
        try:
            sizes = await self._store.sizes(self._archived)
        except Exception as exc:  # noqa: BLE001 - a stale gauge, never a dead task
            raise_if_cancelled()
            log.warning("archive_sizes_stale", error=describe(exc))
            return
        self.sizes = sizes
        for source, size in sizes.items():
            metrics.archive_bytes.labels(source).set(size)
