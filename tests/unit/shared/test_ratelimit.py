"""The buckets a process keeps for itself (shared/ratelimit.LocalBuckets: the
failure budget, the fallback of the shared limits): never more admitted than
the burst and the rate allow, and what one more request costs, however many
clients it has seen."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook_ingest.shared.ratelimit import LocalBuckets


class CountingBuckets(LocalBuckets):
    """Counts the entries its sweeps of full buckets look at."""

    def __init__(self) -> None:
        super().__init__()
        self.scanned = 0

    def _forget_full_buckets(self, now: float) -> None:
        self.scanned += len(self._next_free)
        super()._forget_full_buckets(now)


@pytest.mark.parametrize("per_second", [1.0, 6 / 60])  # the failure budget's, the sign-in throttle's
def test_a_request_costs_the_same_however_many_clients_are_live(per_second):
    """Past 10,000 keys whose bucket is not full (many addresses failing at
    once, or signing in: a sign-in's key stays 10 s), every counted request
    rebuilt the whole dict, ~1 ms a request at 15,000. A sweep must pay for
    itself: the entries looked at stay within a small multiple of the
    requests counted."""
    buckets, clients = CountingBuckets(), 12_000
    for n in range(clients):
        assert buckets.retry_after(f"client-{n}", per_second, burst=5, now=n / 1_000_000) == 0.0
    assert buckets.scanned <= 3 * clients


def test_a_floods_keys_are_let_go_once_their_buckets_are_full_again():
    buckets, clients = LocalBuckets(), 30_000
    for n in range(clients):
        buckets.retry_after(f"flooder-{n}", 1.0, burst=20, now=0.0)
    assert buckets.retry_after("provider", 1.0, burst=20, now=61.0) == 0.0  # a minute on, every flooder's is full
    assert len(buckets._next_free) == 1


@settings(max_examples=300)
@given(
    per_second=st.floats(0.5, 1000),
    burst=st.integers(1, 50),
    gaps=st.lists(st.floats(0, 0.5), min_size=1, max_size=200),
)
def test_the_bucket_never_admits_more_than_burst_plus_rate_times_time(per_second, burst, gaps):
    buckets, now, admitted = LocalBuckets(), 1000.0, []
    for gap in gaps:
        now += gap
        if buckets.retry_after("k", per_second, burst, now) == 0:
            admitted.append(now)
    for i, start in enumerate(admitted):
        for j in range(i, len(admitted)):
            assert j - i + 1 <= burst + per_second * (admitted[j] - start) + 1e-6


@given(per_second=st.floats(0.5, 1000), burst=st.integers(1, 50))
def test_a_burst_is_admitted_at_once_and_retry_after_is_exact(per_second, burst):
    buckets = LocalBuckets()
    assert [buckets.retry_after("k", per_second, burst, 5.0) for _ in range(burst)] == [0.0] * burst
    wait = buckets.retry_after("k", per_second, burst, 5.0)
    assert wait > 0
    assert buckets.retry_after("other", per_second, burst, 5.0) == 0.0  # keys are independent
    assert buckets.retry_after("k", per_second, burst, 5.0 + wait + 1e-9) == 0.0


@given(per_second=st.floats(0.5, 1000), burst=st.integers(1, 50), gaps=st.lists(st.floats(0, 0.5), max_size=60))
def test_waiting_time_is_what_the_next_request_would_get_and_spends_nothing(per_second, burst, gaps):
    buckets, now = LocalBuckets(), 1000.0
    for gap in gaps:
        now += gap
        peeked = buckets.wait("k", per_second, burst, now)
        assert buckets.wait("k", per_second, burst, now) == peeked  # nothing spent
        assert buckets.retry_after("k", per_second, burst, now) == peeked
