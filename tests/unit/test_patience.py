"""How long a live request waits for its confirm (ingress/patience.py): it
follows the slowest confirm of the last window or two, within its bounds."""

from hypothesis import given
from hypothesis import strategies as st

from webhook_ingest.ingress.patience import FACTOR, LONGEST, SHORTEST, WINDOW, Patience


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
