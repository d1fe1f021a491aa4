"""How long a live request waits for its confirm (ingress/publishing/patience.py): it
follows the slowest confirm of the last window or two, within its bounds;
and what it bounds is the broker's silence, not one request's wait."""

import asyncio
import time

from hypothesis import given
from hypothesis import strategies as st

from webhook_ingest.ingress.publishing.patience import FACTOR, LONGEST, SHORTEST, WINDOW, Patience, until_done_or_silent


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_before_any_confirm_a_request_waits_the_longest():
    assert Patience(Clock()).seconds == LONGEST


def test_quick_confirms_make_a_short_wait_once_their_window_is_over():
    clock = Clock()
    patience = Patience(clock)
    patience.confirmed_after(0.002)
    assert patience.seconds == LONGEST  # the window before (nothing learnt yet) still counts
    clock.now += WINDOW
    patience.confirmed_after(0.001)
    assert patience.seconds == SHORTEST


def test_a_slow_confirm_lengthens_the_wait_at_once_and_for_the_next_window():
    clock = Clock()
    patience = Patience(clock)
    for _ in range(2):
        clock.now += WINDOW
        patience.confirmed_after(0.001)
    patience.confirmed_after(0.05)
    assert patience.seconds == FACTOR * 0.05
    clock.now += WINDOW
    patience.confirmed_after(0.001)
    assert patience.seconds == FACTOR * 0.05
    clock.now += WINDOW
    patience.confirmed_after(0.001)
    assert patience.seconds == SHORTEST


def test_a_quiet_spell_keeps_what_was_learnt_before_it():
    clock = Clock()
    patience = Patience(clock)
    for _ in range(2):
        clock.now += WINDOW
        patience.confirmed_after(0.03)
    clock.now += 100 * WINDOW  # no traffic: no confirm to learn from
    patience.confirmed_after(0.001)
    assert patience.seconds == FACTOR * 0.03


@given(st.lists(st.tuples(st.floats(0, 3 * WINDOW), st.floats(0, 10)), max_size=50))
def test_the_wait_stays_within_its_bounds_and_covers_the_current_window(confirms):
    clock = Clock()
    patience = Patience(clock)
    window_ends, slowest = clock.now + WINDOW, 0.0
    for pause, seconds in confirms:
        clock.now += pause
        if clock.now >= window_ends:
            window_ends, slowest = clock.now + WINDOW, 0.0
        slowest = max(slowest, seconds)
        patience.confirmed_after(seconds)
        assert SHORTEST <= patience.seconds <= LONGEST
        assert patience.seconds >= min(LONGEST, FACTOR * slowest)


class Broker:
    """Confirms of other publishes, every `every` seconds until stopped."""

    def __init__(self):
        self.last_confirm = time.monotonic()

    async def confirm_others(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            self.last_confirm = time.monotonic()


async def test_a_slow_confirm_is_waited_for_while_the_broker_confirms_others():
    """A burst queued ahead: this publish is confirmed after three times the
    patience, and the broker confirms other publishes all along."""
    loop = asyncio.get_running_loop()
    publishing, suspicion = loop.create_future(), loop.create_future()
    loop.call_later(0.6, publishing.set_result, None)
    broker = Broker()
    others = asyncio.create_task(broker.confirm_others(every=0.02))
    try:
        await until_done_or_silent(publishing, suspicion, 0.2, lambda: broker.last_confirm)
    finally:
        others.cancel()
    assert publishing.done()


async def test_a_silent_broker_is_given_up_on_after_the_patience():
    loop = asyncio.get_running_loop()
    publishing, suspicion = loop.create_future(), loop.create_future()
    started = time.monotonic()
    await until_done_or_silent(publishing, suspicion, 0.1, lambda: 0.0)
    assert not publishing.done()
    assert time.monotonic() - started >= 0.1


async def test_a_suspicion_ends_the_wait_at_once():
    loop = asyncio.get_running_loop()
    publishing, suspicion = loop.create_future(), loop.create_future()
    loop.call_later(0.01, suspicion.set_result, None)
    started = time.monotonic()
    await until_done_or_silent(publishing, suspicion, 5.0, lambda: 0.0)
    assert time.monotonic() - started < 5.0
