"""Rows written behind their callers' backs, in batches: how the ingress and
the workers write the event archive without a request or a run ever
waiting on it (docs/design.md, "The archive").

`add` appends to a bounded buffer and returns at once. One task writes
what is pending as one batch, LINGER_SECONDS after the batch's first row
came (at once when MAX_BATCH rows wait): nobody waits on the write, so it
may wait for company. Written as soon as anything was pending, a process
taking a thousand events a second made batches of one or two rows, a
statement and a commit for each. It starts once the archive's tables
exist (`ready`, set by the upkeep's first round). While Postgres does not
answer, the rows wait and are tried again, backing off; past the bound,
new rows are dropped, counted (`webhook_archive_rows_dropped_total`) and
logged at most every few seconds. A batch Postgres refuses (not an outage:
a row whose day has no table) is halved until each row it refuses is
alone, and those are dropped: one bad row never holds the others back.
The writes are idempotent, so a batch tried again after an outage cut it
short changes nothing it wrote.
"""

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable

import asyncpg

from webhook_ingest.shared.backoff import pauses
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.observability import get_logger, metrics

log = get_logger(__name__)

MAX_BATCH = 500
LINGER_SECONDS = 0.25  # well within the 2 s an arrival may take to be in the archive
LOG_EVERY_SECONDS = 10.0
# Postgres away or busy, not refusing the rows: they wait and are tried again.
OUTAGES = (
    OSError,
    asyncio.TimeoutError,
    asyncpg.InterfaceError,
    asyncpg.PostgresConnectionError,
    asyncpg.exceptions.OperatorInterventionError,
    asyncpg.exceptions.InsufficientResourcesError,
    asyncpg.ReadOnlySQLTransactionError,
    asyncpg.exceptions.TransactionRollbackError,
    asyncpg.exceptions.LockNotAvailableError,
)

Write = Callable[[list[tuple]], Awaitable[None]]


def is_outage(exc: BaseException) -> bool:
    """Postgres away or busy, as opposed to refusing the rows (asyncpg's
    DataError, a value it cannot encode, is an InterfaceError too)."""
    return isinstance(exc, OUTAGES) and not isinstance(exc, asyncpg.DataError)


class BatchedWriter:
    def __init__(
        self,
        write: Write,
        name: str,
        max_rows: int,
        max_bytes: int | None = None,
        size: Callable[[tuple], int] = lambda row: 0,
        max_batch: int = MAX_BATCH,
        linger: float = LINGER_SECONDS,
    ):
        self._write = write
        self._name = name  # what the rows are, in log lines: "arrivals", "outcomes"
        self._max_rows, self._max_bytes, self._size, self._max_batch = max_rows, max_bytes, size, max_batch
        self._linger = linger
        self._full = asyncio.Event()  # set while a whole batch waits: written without lingering
        self._rows: deque[tuple] = deque()
        self._bytes = 0
        self._wake = asyncio.Event()
        self._drained = asyncio.Event()  # set while nothing waits to be written
        self._drained.set()
        self._writing = 0  # rows taken by the write under way
        self._dropped: dict[str, int] = {}  # by reason, since the last log line
        self._logged_at = 0.0
        self.ready = asyncio.Event()  # the tables exist: writing may start

    @property
    def waiting(self) -> int:
        return len(self._rows) + self._writing

    def add(self, row: tuple) -> None:
        """Queues `row`; drops it (counted) when the buffer is full."""
        size = self._size(row)
        if len(self._rows) >= self._max_rows or (self._max_bytes is not None and self._bytes + size > self._max_bytes):
            self._drop("buffer_full", 1)
            return
        self._rows.append(row)
        self._bytes += size
        self._wake.set()
        self._drained.clear()
        if len(self._rows) >= self._max_batch:
            self._full.set()

    async def run(self) -> None:
        """Forever: writes what is pending, waiting out outages."""
        await self.ready.wait()
        backoff = pauses(0.5, 10.0)
        while True:
            await self._wake.wait()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._full.wait(), self._linger)
            batch = self._take()
            try:
                await self._write_refusing(batch)
            except Exception as exc:  # noqa: BLE001 - only outages leave _write_refusing
                self._give_back(batch)
                pause = next(backoff)
                log.warning(
                    "archive_write_waiting",
                    rows=self._name,
                    waiting=len(self._rows),
                    error=describe(exc),
                    retry_in=pause,
                )
                await asyncio.sleep(pause)
                continue
            self._writing = 0
            metrics.archive_rows_waiting.set(len(self._rows))
            if not self._rows:
                self._drained.set()
            backoff = pauses(0.5, 10.0)

    async def flush(self, timeout: float) -> None:
        """Until everything added is written, for `timeout` at most (a
        process stopping); what is left then is dropped, counted."""
        try:
            await asyncio.wait_for(self._drained.wait(), timeout)
        except TimeoutError:
            self._drop("stopping", self.waiting)
            self._log_drops(force=True)

    def _take(self) -> list[tuple]:
        count = min(len(self._rows), self._max_batch)
        batch = [self._rows.popleft() for _ in range(count)]
        self._bytes -= sum(self._size(row) for row in batch)
        self._writing = len(batch)
        if not self._rows:
            self._wake.clear()
        if len(self._rows) < self._max_batch:
            self._full.clear()
        return batch

    def _give_back(self, batch: list[tuple]) -> None:
        """The batch first again, as it was: nothing newer jumps ahead of it."""
        self._writing = 0
        self._rows.extendleft(reversed(batch))
        self._bytes += sum(self._size(row) for row in batch)
        self._wake.set()
        if len(self._rows) >= self._max_batch:
            self._full.set()

    async def _write_refusing(self, batch: list[tuple]) -> None:
        """Writes `batch`; halves a refused one until the refused rows are
        alone, and drops those. Raises an outage as itself."""
        try:
            await self._write(batch)
        except Exception as exc:  # whatever refuses a row must not stop the others
            if is_outage(exc):
                raise
            if len(batch) == 1:
                log.warning(
                    "archive_row_refused", rows=self._name, source=batch[0][0], key=batch[0][1], error=describe(exc)
                )
                self._drop("refused", 1)
                return
            half = len(batch) // 2
            await self._write_refusing(batch[:half])
            await self._write_refusing(batch[half:])

    def _drop(self, reason: str, count: int) -> None:
        metrics.archive_rows_dropped.labels(reason).inc(count)
        self._dropped[reason] = self._dropped.get(reason, 0) + count
        self._log_drops()

    def _log_drops(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._dropped and (force or now - self._logged_at >= LOG_EVERY_SECONDS):
            log.error("archive_rows_dropped", rows=self._name, **self._dropped)
            self._dropped, self._logged_at = {}, now
