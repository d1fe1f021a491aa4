"""shared/db/group_commit.py: items submitted while a write runs are written
together, each caller learns its own batch's outcome, and nothing waits
for company."""

import asyncio

import pytest

from webhook_ingest.shared.db.group_commit import GroupCommit


class Store:
    """A write that records its batches and can be held or made to fail."""

    def __init__(self):
        self.batches: list[list[int]] = []
        self.release = asyncio.Event()
        self.release.set()
        self.failing: set[int] = set()

    async def write(self, items: list[int]) -> None:
        self.batches.append(items)
        await self.release.wait()
        if self.failing & set(items):
            raise ConnectionError(f"batch {items} not written")


async def test_a_lone_item_is_written_at_once():
    store = Store()
    await asyncio.wait_for(GroupCommit(store.write, writers=1, max_batch=10).submit(1), 5)
    assert store.batches == [[1]]


async def test_items_arriving_while_a_write_runs_share_the_next_one():
    store = Store()
    commit = GroupCommit(store.write, writers=1, max_batch=10)
    store.release.clear()
    first = asyncio.create_task(commit.submit(0))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    later = [asyncio.create_task(commit.submit(n)) for n in range(1, 6)]
    await asyncio.sleep(0)
    store.release.set()
    await asyncio.wait_for(asyncio.gather(first, *later), 5)
    assert store.batches == [[0], [1, 2, 3, 4, 5]]


async def test_a_batch_holds_at_most_max_batch_items_and_every_item_is_written_once():
    store = Store()
    commit = GroupCommit(store.write, writers=2, max_batch=3)
    store.release.clear()
    submits = [asyncio.create_task(commit.submit(n)) for n in range(10)]
    await asyncio.sleep(0)
    store.release.set()
    await asyncio.wait_for(asyncio.gather(*submits), 5)
    assert all(len(batch) <= 3 for batch in store.batches)
    assert sorted(n for batch in store.batches for n in batch) == list(range(10))


async def test_a_failed_write_fails_the_callers_of_its_batch_only():
    store = Store()
    commit = GroupCommit(store.write, writers=1, max_batch=2)
    store.failing = {2}
    store.release.clear()
    submits = [asyncio.create_task(commit.submit(n)) for n in range(4)]
    await asyncio.sleep(0)
    store.release.set()
    outcomes = await asyncio.wait_for(asyncio.gather(*submits, return_exceptions=True), 5)
    assert store.batches == [[0, 1], [2, 3]]
    assert outcomes[:2] == [None, None]
    assert all(isinstance(outcome, ConnectionError) for outcome in outcomes[2:])


async def test_an_item_submitted_as_the_last_write_ends_is_still_written():
    """A writer that found nothing left leaves at once, so the next item starts another."""
    store = Store()
    commit = GroupCommit(store.write, writers=1, max_batch=10)
    await commit.submit(1)
    await asyncio.wait_for(commit.submit(2), 5)
    assert store.batches == [[1], [2]]


@pytest.mark.parametrize("writers", [1, 3])
async def test_a_caller_cancelled_while_waiting_does_not_stop_the_others(writers):
    store = Store()
    commit = GroupCommit(store.write, writers=writers, max_batch=10)
    store.release.clear()
    gone, staying = asyncio.create_task(commit.submit(1)), asyncio.create_task(commit.submit(2))
    await asyncio.sleep(0)
    gone.cancel()
    store.release.set()
    await asyncio.wait_for(staying, 5)
    assert gone.cancelled()


async def test_each_caller_gets_its_own_answer_from_its_batch():
    batches = []

    async def write(items: list[int]) -> list[int]:
        batches.append(items)
        await asyncio.sleep(0.01)
        return [item * 10 for item in items]

    commit = GroupCommit(write, writers=1, max_batch=10)
    answers = await asyncio.wait_for(asyncio.gather(*(commit.submit(n) for n in range(6))), 5)
    assert answers == [0, 10, 20, 30, 40, 50]
    assert batches == [[0, 1, 2, 3, 4, 5]]  # submitted in one iteration: one write
