"""The fault steps' counting (tests/bench/faults.py): what a worker's kill
or pause cost each stack, from its counts."""

from tests.bench.faults import Outcome


def test_rows_past_a_keys_first_are_duplicates_and_keys_without_one_lost():
    outcome = Outcome(accepted=1200, written=1195, rows=1203)

    assert outcome.figures("celery", "kill") == {"celery_lost_after_kill": 5, "celery_duplicated_after_kill": 8}


def test_calls_past_a_keys_first_are_repeats():
    outcome = Outcome(accepted=1200, written=1200, rows=1200, calls=1207, called=1200)

    assert outcome.figures("ours", "pause") == {
        "ours_lost_after_pause": 0,
        "ours_duplicated_after_pause": 0,
        "ours_calls_repeated_after_pause": 7,
    }


def test_more_keys_written_than_accepted_count_as_no_loss_not_a_negative_one():
    outcome = Outcome(accepted=1198, written=1200, rows=1200)

    assert outcome.figures("dramatiq", "pause")["dramatiq_lost_after_pause"] == 0
