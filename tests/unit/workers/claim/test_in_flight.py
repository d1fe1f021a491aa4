"""workers.claim.in_flight: one run of a key at a time in a process, whatever
way a run ends (returns, raises, is cancelled) and however a copy stops waiting:
no key is left held, so no later copy waits on a run that is gone."""

import asyncio

import pytest

from webhook_ingest.workers.claim.in_flight import KeysInFlight


async def _holding(keys: KeysInFlight, key: str, release: asyncio.Event) -> asyncio.Task:
    """A run of `key` that ends once `release` is set, started: the key is held when this returns."""
    started = asyncio.Event()

    async def run() -> None:
        async with keys.running(key):
            started.set()
            await release.wait()

    task = asyncio.create_task(run())
    await started.wait()
    return task


async def test_a_copy_runs_after_the_run_of_its_key_not_beside_it():
    keys = KeysInFlight()
    order: list[str] = []
    release = asyncio.Event()

    async def copy_run() -> None:
        async with keys.running("k"):
            order.append("copy")

    first = await _holding(keys, "k", release)
    copy = asyncio.create_task(copy_run())
    for _ in range(3):  # the copy has started, and waits
        await asyncio.sleep(0)
    await run_other(keys, order)  # another key is not held up
    assert order == ["other"] and "k" in keys
    release.set()
    await asyncio.gather(first, copy)
    assert order == ["other", "copy"]
    assert "k" not in keys


async def run_other(keys: KeysInFlight, order: list[str]) -> None:
    async with keys.running("other"):
        order.append("other")


@pytest.mark.parametrize("ends", ["raises", "is cancelled"])
async def test_a_run_that_does_not_return_lets_its_copy_run(ends):
    keys = KeysInFlight()
    started = asyncio.Event()

    async def holder() -> None:
        async with keys.running("k"):
            started.set()
            if ends == "raises":
                await asyncio.sleep(0)
                raise RuntimeError("an outage: the worker waits for the service, then runs it again")
            await asyncio.Event().wait()

    held = asyncio.create_task(holder())
    await started.wait()
    ran: list[str] = []

    async def copy() -> None:
        async with keys.running("k"):
            ran.append("copy")

    waiting = asyncio.create_task(copy())
    await asyncio.sleep(0)
    if ends == "is cancelled":
        held.cancel()
    with pytest.raises((RuntimeError, asyncio.CancelledError)):
        await held
    await waiting
    assert ran == ["copy"] and "k" not in keys


async def test_a_copy_cancelled_while_it_waits_leaves_the_run_and_the_key_as_they_were():
    keys = KeysInFlight()
    release = asyncio.Event()

    held = await _holding(keys, "k", release)

    async def copy() -> None:
        async with keys.running("k"):
            raise AssertionError("a cancelled copy never runs")

    waiting = asyncio.create_task(copy())
    await asyncio.sleep(0)
    waiting.cancel()  # a stop past its grace
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert "k" in keys  # still the holder's
    release.set()
    await held
    assert "k" not in keys
    async with keys.running("k"):  # and free for the next
        pass


async def test_a_batch_asks_for_the_free_keys_only_and_holds_them_until_its_block_ends():
    keys = KeysInFlight()
    release = asyncio.Event()

    held = await _holding(keys, "held", release)
    ran: list[str] = []

    async def copy() -> None:
        async with keys.running("free"):
            ran.append("copy")

    with keys.running_free(["free", "held"]) as free:  # no wait for the held key
        assert free == ["free"]
        waiting = asyncio.create_task(copy())
        await asyncio.sleep(0.01)
        assert ran == []  # a copy of a key the batch holds waits for the batch
    await waiting
    assert ran == ["copy"] and "free" not in keys and "held" in keys
    release.set()
    await held
    assert "held" not in keys


async def test_a_batch_block_that_raises_gives_its_keys_back():
    keys = KeysInFlight()
    with pytest.raises(RuntimeError), keys.running_free(["a", "b"]):
        raise RuntimeError("rolled back by an outage")
    assert "a" not in keys and "b" not in keys
