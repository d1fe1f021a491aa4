"""Many callers, one write per batch: what the outbox needs when a whole
ingress process turns to it at once (docs/design.md, "The outbox").

A caller's item joins the pending batch; when fewer than `writers` writes
run, one starts and takes what is pending; while writes run, later items
wait together for the next one. A lone caller is written at once, without
waiting for company. Every caller learns its own batch's outcome: returned
means written, an exception means its batch was not.
"""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

Item = TypeVar("Item")


class GroupCommit(Generic[Item]):
    def __init__(self, write: Callable[[list[Item]], Awaitable[None]], writers: int, max_batch: int):
        self._write = write
        self._writers = writers
        self._max_batch = max_batch
        self._pending: list[tuple[Item, asyncio.Future]] = []
        self._writing: set[asyncio.Task] = set()

    async def submit(self, item: Item) -> None:
        """Returns once the batch holding `item` was written; raises its failure."""
        outcome = asyncio.get_running_loop().create_future()
        self._pending.append((item, outcome))
        if len(self._writing) < self._writers:
            self._writing.add(asyncio.create_task(self._write_while_pending(), name="group-commit"))
        await outcome  # a caller cancelled meanwhile: its item may still be written

    async def _write_while_pending(self) -> None:
        try:
            await self._write_batches()
        finally:  # at once, not in a done callback: an item added meanwhile must find a writer missing
            self._writing.discard(asyncio.current_task())

    async def _write_batches(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[:self._max_batch], self._pending[self._max_batch:]
            try:
                await self._write([item for item, _ in batch])
            except asyncio.CancelledError:  # shutting down: nobody is told it was written
                for _, outcome in batch + self._pending:
                    outcome.cancel()
                self._pending = []
                raise
            except Exception as exc:  # noqa: BLE001 - each caller of the batch raises it
                _settle(batch, exc)
            else:
                _settle(batch, None)


def _settle(batch: list[tuple[Item, asyncio.Future]], failure: Exception | None) -> None:
    for _, outcome in batch:
        if outcome.done():  # its caller was cancelled
            continue
        if failure is None:
            outcome.set_result(None)
        else:
            outcome.set_exception(failure)
