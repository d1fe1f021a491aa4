"""The keys this worker process is running: one run of a key at a time.

Copies of one event reach one worker together: a provider's retries, a
redelivery, a deferred copy coming back. The Redis lock keeps them apart
for a while (`Processor._claim_when_free`), a degraded worker has none, and
past it each copy asks Postgres for the key's lease like another worker's
run would. A process that stalls past the lease (a GC pause, SIGSTOP) then
wakes its run and its copies at once, and a copy's ask may reach Postgres
before the run's renewal: the lapsed lease goes to the copy, and the run,
whose outside call went out as it woke, is refused and its call made again.
Within one process nothing needs Postgres to tell them apart: a copy waits
here until its key's run has ended, then asks (and usually finds it
completed). Between processes the lease still decides (docs/design.md,
"A lock that cannot be kept").
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Iterator


class KeysInFlight:
    def __init__(self) -> None:
        self._ended: dict[str, asyncio.Event] = {}

    def __contains__(self, key: str) -> bool:
        return key in self._ended

    @contextlib.asynccontextmanager
    async def running(self, key: str) -> AsyncIterator[None]:
        """The block is this process's only run of `key`, once another's has ended."""
        while (ended := self._ended.get(key)) is not None:
            await ended.wait()
        with self._held([key]):
            yield

    @contextlib.contextmanager
    def running_free(self, keys: Iterable[str]) -> Iterator[list[str]]:
        """The block runs those of `keys` no run here holds, without waiting."""
        free = [key for key in dict.fromkeys(keys) if key not in self._ended]
        with self._held(free):
            yield free

    @contextlib.contextmanager
    def _held(self, keys: list[str]) -> Iterator[None]:
        for key in keys:
            self._ended[key] = asyncio.Event()
        try:
            yield
        finally:
            for key in keys:
                self._ended.pop(key).set()
