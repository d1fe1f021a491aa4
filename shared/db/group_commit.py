"""Many callers, one write per batch: what the outbox needs when a whole
ingress process turns to it at once (docs/design.md, "The outbox"), and
what keeps a worker's hundreds of leases and locks alive in a few round
trips (workers/claim/renewals.py).

A caller's item joins the pending batch; when fewer than `writers` writes
run, one starts and takes what is pending; while writes run, later items
wait together for the next one. A lone caller is written at once, without
waiting for company. Every caller learns its own batch's outcome: returned
means written, an exception means its batch was not. A write may answer
each item (a list in the batch's order): its caller gets its own answer;
a write that returns None answers None to all.
"""

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

Item = TypeVar("Item")
Answer = TypeVar("Answer")


class GroupCommit(Generic[Item, Answer]):
    def __init__(self, write: Callable[[list[Item]], Awaitable[Sequence[Answer] | None]], writers: int, max_batch: int):
        self._write = write
        self._writers = writers
        self._max_batch = max_batch
        self._pending: list[tuple[Item, asyncio.Future]] = []
        self._writing: set[asyncio.Task] = set()

    async def submit(self, item: Item) -> Answer | None:
        """Returns once the batch holding `item` was written (with the
        write's answer for it); raises its failure."""
        outcome = asyncio.get_running_loop().create_future()
        self._pending.append((item, outcome))
        if len(self._writing) < self._writers:
            self._writing.add(asyncio.create_task(self._write_while_pending(), name="group-commit"))
        return await outcome  # a caller cancelled meanwhile: its item may still be written

    async def _write_while_pending(self) -> None:
        try:
            await self._write_batches()
        finally:  # at once, not in a done callback: an item added meanwhile must find a writer missing
            self._writing.discard(asyncio.current_task())

    async def _write_batches(self) -> None:
        while self._pending:
            batch, self._pending = self._pending[: self._max_batch], self._pending[self._max_batch :]
            try:
                answers = await self._write([item for item, _ in batch])
            except asyncio.CancelledError:  # shutting down: nobody is told it was written
                for _, outcome in batch + self._pending:
                    outcome.cancel()
                self._pending = []
                raise
            except Exception as exc:  # noqa: BLE001 - each caller of the batch raises it
                _fail(batch, exc)
            else:
                _answer(batch, answers)


def _answer(batch: list[tuple[Item, asyncio.Future]], answers: Sequence | None) -> None:
    for index, (_, outcome) in enumerate(batch):
        if not outcome.done():  # else its caller was cancelled
            outcome.set_result(None if answers is None else answers[index])


def _fail(batch: list[tuple[Item, asyncio.Future]], failure: Exception) -> None:
    for _, outcome in batch:
        if not outcome.done():
            outcome.set_exception(failure)
