"""How long the broker may be silent while a live request waits for its
confirm, before the broker is suspect and the request goes to the outbox
(docs/design.md, "The outbox").

A fixed second made the first moments of every outage slow: at 1,000 req/s
the requests of the first quarter second waited until half the concurrency
bound waited with them (p99 ~150 ms while the outbox took over). The wait
now follows the confirms themselves: `FACTOR` times the slowest confirm of
the last one or two windows of `WINDOW` seconds, within [`SHORTEST`,
`LONGEST`]. A healthy broker that slows under load confirms slower and the
patience grows with it; a blocked or stalled one shows as a confirm much
slower than any lately, caught within tens of milliseconds. Giving up early
is never wrong — the request goes to the outbox, and a late confirm only
makes a copy that the workers settle — only slower, which is what the
floor and the factor keep rare.
"""

import asyncio
import functools
import time
from collections.abc import Callable

SHORTEST, LONGEST = 0.025, 1.0  # seconds
FACTOR = 4
WINDOW = 2.0  # seconds
# After the patience, one more look this much later: a loop that lagged past
# the patience runs its timers before it reads the confirms that arrived
# meanwhile (libuv: timers, then I/O).
LAG_ALLOWANCE = 0.005


class Patience:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._window_ends = clock() + WINDOW
        self._slowest_now = 0.0  # the slowest confirm in the current window
        self._slowest_before = LONGEST / FACTOR  # ... in the window before (none seen yet: the longest wait)

    def confirmed_after(self, seconds: float) -> None:
        """A live publish was confirmed `seconds` after it was made."""
        now = self._clock()
        if now >= self._window_ends:
            if self._slowest_now:  # a window without confirms keeps what was learnt before it
                self._slowest_before = self._slowest_now
            self._slowest_now = 0.0
            self._window_ends = now + WINDOW
        if seconds > self._slowest_now:
            self._slowest_now = seconds

    @property
    def seconds(self) -> float:
        slowest = max(self._slowest_now, self._slowest_before)
        return min(LONGEST, max(SHORTEST, FACTOR * slowest))


async def until_done_or_silent(
    publishing: asyncio.Future, suspicion: asyncio.Future, patience: float, last_confirm: Callable[[], float]
) -> None:
    """Waits until `publishing` or `suspicion` is done, or until the broker
    has been silent for `patience`: no confirm of any publish (`last_confirm`,
    a time.monotonic()) since this wait began or since the latest one. A
    broker that is only slow — a burst queued ahead of this publish, a slow
    disk — keeps confirming others meanwhile; a blocked or stalled one
    confirms nothing. One more look LAG_ALLOWANCE after the patience."""
    waiting_since = time.monotonic()
    while not (publishing.done() or suspicion.done()):
        heard = last_confirm()
        wait = max(heard, waiting_since) + patience - time.monotonic()
        if wait <= 0:
            await _first_of(publishing, suspicion, LAG_ALLOWANCE)
            if last_confirm() == heard:
                return
            continue
        await _first_of(publishing, suspicion, wait)


async def _first_of(publishing: asyncio.Future, suspicion: asyncio.Future, seconds: float) -> None:
    """Until either is done or `seconds` have passed: `asyncio.wait(…,
    FIRST_COMPLETED)` without its sets, its futures wrapped anew and its
    done and pending sets built (a request's publish waits through this)."""
    woken = asyncio.get_running_loop().create_future()
    timer = woken.get_loop().call_later(seconds, _wake, woken)
    wake = functools.partial(_wake, woken)
    publishing.add_done_callback(wake)
    suspicion.add_done_callback(wake)
    try:
        await woken
    finally:
        timer.cancel()
        publishing.remove_done_callback(wake)
        suspicion.remove_done_callback(wake)


def _wake(woken: asyncio.Future, *_done: object) -> None:
    if not woken.done():
        woken.set_result(None)
