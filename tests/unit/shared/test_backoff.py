"""The pauses between tries while a service is away."""

from itertools import islice

from webhook_ingest.shared.backoff import pauses


def test_pauses_double_up_to_the_ceiling_and_stay_there():
    assert list(islice(pauses(0.2, 1.0), 6)) == [0.2, 0.4, 0.8, 1.0, 1.0, 1.0]
    assert list(islice(pauses(), 7))[-1] == 5.0
