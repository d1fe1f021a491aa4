"""The buckets a process keeps for itself (shared/ratelimit.LocalBuckets: the
failure budget, the fallback of the shared limits): what one more request
costs, however many clients it has seen."""

import pytest

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
