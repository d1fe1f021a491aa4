"""The ingress's part of the event archive (docs/design.md, "The archive"):
every request answered 200 — accepted, or a duplicate of a completed
event — becomes an arrival row, with its body, headers and event type.

Never on the request's path: the row is handed to a bounded buffer once
the event is durably stored (the broker's confirm, or the outbox's
commit), and one task per process writes the buffer in batches
(`shared/archive/writer.py`), usually within milliseconds of the answer.
A slow or absent Postgres costs the requests nothing; its rows wait, up to
MAX_ROWS and MAX_BODY_BYTES per process, then are dropped and counted.
"""

import asyncio
from collections.abc import AsyncIterator, Mapping

from aiohttp import web

from webhook_ingest.shared.archive import ArchiveStore, BatchedWriter
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.db import jsonb
from webhook_ingest.shared.event import EventMessage
from webhook_ingest.shared.event import types as event_type
from webhook_ingest.shared.sources import Source
from webhook_ingest.shared.upkeep import ArchiveUpkeep

from .appkeys import database_pool_key, sources_key

MAX_ROWS = 10_000  # about 10 s of a busy process's traffic while Postgres is away
MAX_BODY_BYTES = 32 * 1024 * 1024
FLUSH_SECONDS = 1.0  # on stopping, for the rows still held (then the pool gets its own 2 s)


class Arrivals:
    def __init__(self, store: ArchiveStore, sources: dict[str, Source]):
        self._writer = BatchedWriter(store.write_arrivals, "arrivals", MAX_ROWS, MAX_BODY_BYTES, size=_body_size)
        self._upkeep = ArchiveUpkeep(store, sources)
        self._writer.ready = self._upkeep.ready
        self._tasks: list[asyncio.Task] = []

    def arrived(self, event: EventMessage, source: Source, payload: Mapping, duplicate: bool = False) -> None:
        """An event answered 200: accepted (stored), or a duplicate of a completed one."""
        self._add(event, source, payload, archive.DUPLICATE if duplicate else archive.QUEUED)

    def ignored(self, event: EventMessage, source: Source, payload: Mapping, rule: str) -> None:
        """An event answered 200 ignored: one of the source's `ignore` rules matched; never queued."""
        self._add(event, source, payload, archive.IGNORED, rule)

    def _add(self, event: EventMessage, source: Source, payload: Mapping, status: str, rule: str | None = None) -> None:
        if not source.retention:
            return
        kind = event_type.resolve(source.event_type_selectors, event.headers, payload)
        self._writer.add(archive.arrival_row(event, kind, jsonb(event.headers), status, rule))

    def archive_sizes(self) -> dict[str, int]:
        """Each archived source's bytes on disk, as `webhook_archive_bytes` last
        read them (every minute); empty until the first reading."""
        return self._upkeep.sizes

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._upkeep.run(), name="archive-upkeep"),
            asyncio.create_task(self._writer.run(), name="archive-arrivals"),
        ]

    async def close(self) -> None:
        await self._writer.flush(FLUSH_SECONDS)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


arrivals_key = web.AppKey("arrivals", Arrivals)


async def archive_ctx(app: web.Application) -> AsyncIterator[None]:
    """aiohttp cleanup_ctx, after the database pool's: closed before it, its rows flushed first."""
    arrivals = Arrivals(ArchiveStore(app[database_pool_key]), app[sources_key])
    arrivals.start()
    app[arrivals_key] = arrivals
    yield
    await arrivals.close()


def _body_size(row: tuple) -> int:
    return len(row[7])  # archive.arrival_row's body
