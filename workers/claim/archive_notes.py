"""A worker's part of the event archive (docs/design.md, "The archive"): what
became of each message it settled, written in batches behind its back.

`settled` takes what the worker's one funnel of settled messages sees
(processed, a duplicate, a conflict); `failed` what only the processor
knows with its error (a retry handed on, a dead letter). Each is a row of
a bounded buffer that one task writes (`shared/archive/writer.py`), after
the commit and the ack it describes: no statement, no await is added to a
run, and Postgres being slow or away costs the runs nothing. A worker
killed between its ack and that write leaves the row at its earlier status
until the archive's upkeep settles it from the completion record or the
dead letter (shared/archive/settling.py), within a couple of minutes.

Until `start` (a worker's side tasks; the simulator and the unit tests
never start it) notes are ignored.
"""

import asyncio
import time
from dataclasses import replace

from webhook_ingest.shared.archive import ArchiveStore, BatchedWriter
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.event import EventMessage
from webhook_ingest.shared.replays import keys as replay_keys
from webhook_ingest.shared.sources import Source
from webhook_ingest.shared.upkeep import ArchiveUpkeep

from .states import Outcome

MAX_ROWS = 50_000  # small rows (no body): minutes of a busy worker while Postgres is away
FLUSH_SECONDS = 2.0
ERROR_CHARS = 2000

SETTLED = {
    Outcome.PROCESSED: archive.PROCESSED,
    Outcome.STALE: archive.STALE,
    Outcome.DUPLICATE: archive.DUPLICATE,
    Outcome.CONFLICT: archive.CONFLICT,
}
FAILED = {Outcome.RETRIED: archive.RETRYING, Outcome.DEAD: archive.DEAD}
# An event the ingress accepted for a route the worker's sources file no
# longer has (docs/design.md, "Routes": the worker's file decides)
UNROUTED_ERROR = "no route of the worker's sources file takes it (the ingress's did)"


class ArchiveNotes:
    def __init__(self, store: ArchiveStore | None, sources: dict[str, Source]):
        self._store = store
        self._sources = sources
        self._writer: BatchedWriter | None = None
        self._tasks: list[asyncio.Task] = []

    def start(self) -> None:
        assert self._store is not None
        writer = BatchedWriter(self._store.write_outcomes, "outcomes", MAX_ROWS)
        upkeep = ArchiveUpkeep(self._store, self._sources)
        writer.ready = upkeep.ready
        self._tasks = [
            asyncio.create_task(upkeep.run(), name="archive-upkeep"),
            asyncio.create_task(writer.run(), name="archive-outcomes"),
        ]
        self._writer = writer

    async def close(self) -> None:
        """What is held written within FLUSH_SECONDS; the tasks ended."""
        if self._writer is not None:
            await self._writer.flush(FLUSH_SECONDS)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def settled(self, message: EventMessage, outcome: Outcome) -> None:
        if outcome is Outcome.UNROUTED:  # acked, and nothing will run it: not `queued` for ever
            self._note(message, archive.IGNORED, UNROUTED_ERROR)
            return
        status = SETTLED.get(outcome)
        if status is not None:
            self._note(message, status)

    def failed(self, message: EventMessage, outcome: Outcome, exc: BaseException) -> None:
        """The handler's failure `exc` became `outcome` (a retry, a dead letter, or nothing: completed meanwhile)."""
        status = FAILED.get(outcome)
        if status is not None:
            self._note(message, status, describe(exc)[:ERROR_CHARS])

    def _note(self, message: EventMessage, status: str, error: str | None = None) -> None:
        source = self._sources.get(message.source)
        if self._writer is None or source is None or not source.retention:
            return
        if replay_keys.parse(message.key) is not None:  # a replay's run: the event's arrival stays as it ended
            return
        # a route's run: the event's one row shows it (docs/design.md, "A routed event in the archive")
        if message.route:
            message = replace(message, key=message.key.removesuffix(f"#{message.route}"))
            error = None if error is None else f"route {message.route}: {error}"[:ERROR_CHARS]
        self._writer.add(archive.outcome_row(message, status, time.time(), error))


NO_NOTES = ArchiveNotes(None, {})  # a processor built without a worker's notes (unit tests, the simulator)
