"""The simulator's event loop: virtual time, and a seeded order of what is ready.

asyncio's own loop runs ready callbacks first in, first out, and waits for
real time to reach its next timer. This one never waits: when nothing is
ready, its clock jumps to the next timer; and the callbacks that are ready
together run in an order drawn from the seed, so that one seed explores
one interleaving and the same seed the same one again. A callback is a
*step*: the resumption of one task at one await point, or one timer.

Everything else is asyncio's (`BaseEventLoop`: futures, tasks, timers,
cancellation), so the code under test runs on it unchanged. Its clock is
the one the worker modules read (`VirtualTime`, patched in by
`tests.sim.patches`), so leases, locks and TTLs all run in virtual time.

Each task also remembers which simulated process created it (the
`PROCESS` context variable, inherited by every task a task creates), so
that killing a process can cancel exactly its tasks.

A process can be paused (a GC pause, a stopped VM): the callbacks that
belong to it (by the `PROCESS` of their context) wait, frozen, until the
pause ends, while the rest of the world and the clock go on. A process's
loop can lag (a loaded host): each step it runs pauses it a little.

The order drawn must not depend on anything but the seed. Code under test
iterates sets of tasks (`asyncio.wait`'s, a TaskGroup's), whose order is
that of their memory addresses; so before it is shuffled, a batch is
sorted by a key that is the same in every run: the creation number of the
task a callback resumes, else the creation number of the callback.
"""

import asyncio
import contextvars
import heapq
import random
import time as real_time
import weakref

PROCESS: contextvars.ContextVar[str | None] = contextvars.ContextVar("sim_process", default=None)
EPOCH = 1_800_000_000.0  # what time.time() says at virtual 0 (a fixed date: the same trace every run)


class Stuck(Exception):
    """Nothing is ready and no timer is set: whatever still waits, waits for ever."""


class OutOfSteps(Exception):
    """The run used its step budget."""


class SimLoop(asyncio.BaseEventLoop):
    def __init__(self, rng: random.Random, shuffle: bool = True, max_steps: int | None = None):
        super().__init__()
        self._now = 0.0
        self._rng = rng
        self._shuffle = shuffle
        self.steps = 0
        self.max_steps = max_steps
        self.owners: weakref.WeakKeyDictionary[asyncio.Task, str] = weakref.WeakKeyDictionary()
        self._numbers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # task or handle -> creation number
        self._created = 0
        self.paused: dict[str, float] = {}  # process -> until
        self.lagging: dict[str, tuple[float, float]] = {}  # process -> (until, seconds each step costs it)
        self._frozen: dict[str, list] = {}
        self.errors: list[dict] = []  # what reached the loop's exception handler
        self.set_exception_handler(lambda loop, context: self.errors.append(context))

    def time(self) -> float:
        return self._now

    def create_task(self, coro, *, name=None, context=None):
        task = super().create_task(coro, name=name, context=context)
        self._number(task)
        owner = context.get(PROCESS) if context is not None else PROCESS.get()
        if owner is not None:
            self.owners[task] = owner
        return task

    def call_soon(self, callback, *args, context=None):
        handle = super().call_soon(callback, *args, context=context)
        if not isinstance(getattr(callback, "__self__", None), asyncio.Task):  # else ordered by its task
            self._number(handle)
        return handle

    def call_at(self, when, callback, *args, context=None):
        return self._number(super().call_at(when, callback, *args, context=context))

    def _number(self, created):
        self._created += 1
        self._numbers[created] = self._created
        return created

    def _order(self, handle) -> int:
        resumed = getattr(handle._callback, "__self__", None)
        if isinstance(resumed, asyncio.Task) and resumed in self._numbers:
            return self._numbers[resumed]
        return self._numbers.get(handle, 0)

    def pause(self, process: str, seconds: float) -> None:
        until = max(self.paused.get(process, 0.0), self._now + seconds)
        self.paused[process] = until
        self.call_at(until, self._thaw, process, context=contextvars.Context())

    def lag(self, process: str, until: float, per_step: float) -> None:
        """Until `until`, each step of `process` costs it `per_step`: its
        next callbacks wait that long (a loaded loop), its timers fire late."""
        self.lagging[process] = (until, per_step)

    def _lagged(self, handle) -> None:
        context = handle._context
        process = context.get(PROCESS) if context is not None else None
        if process is None or process not in self.lagging:
            return
        until, per_step = self.lagging[process]
        if self._now >= until:
            del self.lagging[process]
        elif process not in self.paused:
            self.pause(process, per_step)

    def unpause(self, process: str) -> None:
        self.paused.pop(process, None)
        self._ready.extend(self._frozen.pop(process, []))

    def _thaw(self, process: str) -> None:
        if self.paused.get(process, float("inf")) <= self._now:
            self.unpause(process)

    def _frozen_now(self, handle) -> bool:
        context = handle._context
        process = context.get(PROCESS) if context is not None else None
        if process is None or process not in self.paused:
            return False
        self._frozen.setdefault(process, []).append(handle)
        return True

    def tasks_of(self, process: str) -> list[asyncio.Task]:
        return [task for task, owner in list(self.owners.items()) if owner == process and not task.done()]

    def _process_events(self, event_list) -> None:
        pass  # no I/O: every outside party is simulated

    def _write_to_self(self) -> None:
        pass  # one thread: nothing to wake

    def _run_once(self) -> None:
        self._drop_cancelled_timers()
        ready, scheduled = self._ready, self._scheduled
        if not ready and not self._stopping:
            if not scheduled:
                raise Stuck()
            self._now = max(self._now, scheduled[0]._when)
        while scheduled and scheduled[0]._when <= self._now:
            handle = heapq.heappop(scheduled)
            handle._scheduled = False
            ready.append(handle)
        batch = list(ready)
        ready.clear()
        if self._shuffle and len(batch) > 1:
            batch.sort(key=self._order)
            self._rng.shuffle(batch)
        paused = self.paused
        for handle in batch:
            if handle._cancelled or (paused and self._frozen_now(handle)):
                continue
            self.steps += 1
            handle._run()
            if self.lagging:
                self._lagged(handle)
        if self.max_steps is not None and self.steps > self.max_steps:
            raise OutOfSteps()

    def _drop_cancelled_timers(self) -> None:
        scheduled = self._scheduled
        if len(scheduled) > 100 and self._timer_cancelled_count * 2 > len(scheduled):
            kept = [handle for handle in scheduled if not handle._cancelled]
            for handle in scheduled:
                if handle._cancelled:
                    handle._scheduled = False
            heapq.heapify(kept)
            self._scheduled = kept
            self._timer_cancelled_count = 0
            return
        while scheduled and scheduled[0]._cancelled:
            self._timer_cancelled_count -= 1
            heapq.heappop(scheduled)._scheduled = False


class VirtualTime:
    """Stands for the `time` module in the modules under test: their
    monotonic, wall and performance clocks all read the loop's clock."""

    def __init__(self, loop: SimLoop):
        self._loop = loop

    def monotonic(self) -> float:
        return self._loop.time()

    def perf_counter(self) -> float:
        return self._loop.time()

    def time(self) -> float:
        return EPOCH + self._loop.time()

    def __getattr__(self, name: str):
        return getattr(real_time, name)
