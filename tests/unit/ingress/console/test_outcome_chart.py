"""The overview's chart of the last hour (ingress/console/outcome_chart.py):
pure geometry, no services."""

from datetime import UTC, datetime, timedelta

from webhook_ingest.ingress.console.outcome_chart import HEIGHT, chart, nice_ceiling

START = datetime(2026, 11, 29, 7, 0, tzinfo=UTC)


def minutes(*counts: tuple[int, int, int, int]) -> list[dict]:
    return [
        {"minute": START + timedelta(minutes=n), "processed": p, "retried": r, "dead": d, "duplicate": u}
        for n, (p, r, d, u) in enumerate(counts)
    ]


def test_the_scale_is_a_round_number_at_least_the_busiest_minute():
    assert [nice_ceiling(v) for v in (0, 1, 3, 7, 10, 11, 70, 101, 4999)] == [1, 1, 5, 10, 10, 20, 100, 200, 5000]


def test_each_minute_is_a_stack_of_its_outcomes_to_scale():
    drawn = chart(minutes((6, 2, 2, 0), (0, 0, 0, 0)))
    assert drawn.scale_max == 10 and drawn.middle == "5"
    busy, quiet = drawn.bars
    assert [(s.outcome, s.count, s.height) for s in busy.segments] == [
        ("processed", 6, 0.6 * HEIGHT),
        ("retried", 2, 0.2 * HEIGHT),
        ("dead", 2, 0.2 * HEIGHT),
    ]
    assert busy.segments[-1].y == 0  # the busiest minute reaches the top
    assert busy.label == "07:00 UTC: 6 processed, 2 retried, 2 dead" and quiet.label == "07:01 UTC: nothing"
    assert drawn.times == [(0.0, "07:00")]
    assert drawn.description == (
        "In the last 2 minutes: 6 processed, 2 retried, 2 dead, 0 duplicate; the busiest minute, 07:00 UTC, had 10."
    )


def test_an_hour_of_nothing_is_drawn_empty_and_said_so():
    drawn = chart(minutes(*[(0, 0, 0, 0)] * 60))
    assert drawn.scale_max == 1 and all(not bar.segments for bar in drawn.bars)
    assert drawn.description == "In the last 60 minutes: 0 processed, 0 retried, 0 dead, 0 duplicate."
