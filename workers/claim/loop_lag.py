"""How long the event loop stood still: tells a busy loop from a black hole.

A timer every 50 ms notes how late it ran. A lease keeper whose
confirmation got no answer in time asks how long the loop stood still
since that confirmation was due: an answer that came back while the loop
was busy with every run that woke with it (a pause, SIGSTOP), or while
every step ran slow (a loaded host: late on every tick, a little each
time), is not a black-holed server's silence (`workers.claim.lease`, docs/design.md,
"A lock that cannot be kept"). One monitor per event loop, started by the first keeper.
"""

import asyncio
import collections
import weakref

TICK_SECONDS = 0.05
NOTED_LATENESS = 0.005  # a tick later than this is remembered
REMEMBERED_TICKS = 1024  # the late ones, newest last


class LoopLag:
    def __init__(self) -> None:
        self._late: collections.deque[tuple[float, float]] = collections.deque(maxlen=REMEMBERED_TICKS)
        self._due = 0.0
        self._schedule(asyncio.get_running_loop())

    def stood_still_since(self, since: float) -> float:
        """How long in all the loop was late since `since` (its clock): the
        whole lateness of every tick that ran from then on."""
        total = 0.0
        for ran_at, lateness in reversed(self._late):
            if ran_at < since:
                break
            total += lateness
        return total

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        self._due = loop.time() + TICK_SECONDS
        loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        loop = asyncio.get_running_loop()  # not kept: the loop's timer is what keeps the monitor
        now = loop.time()
        if now - self._due > NOTED_LATENESS:
            self._late.append((now, now - self._due))
        self._schedule(loop)


_monitors: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopLag] = weakref.WeakKeyDictionary()


def of_running_loop() -> LoopLag:
    """The running loop's monitor, started on first use."""
    loop = asyncio.get_running_loop()
    monitor = _monitors.get(loop)
    if monitor is None:
        monitor = _monitors[loop] = LoopLag()
    return monitor
