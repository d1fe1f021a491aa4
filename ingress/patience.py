"""How long a live request waits for its broker confirm before the broker
is suspect and the request goes to the outbox (docs/design.md, "The outbox").

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

import time
from collections.abc import Callable

SHORTEST, LONGEST = 0.025, 1.0  # seconds
FACTOR = 4
WINDOW = 2.0  # seconds


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
