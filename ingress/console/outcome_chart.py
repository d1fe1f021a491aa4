"""The overview's picture of the last hour: each minute's outcomes (as the
workers counted them in their heartbeats, shared/worker_heartbeats.py) as a
stacked bar, drawn on the server as inline SVG by the template
(`overview_figures.html`) — nothing loaded from elsewhere, a title and a
description for screen readers, and the same figures as a table beside it.
"""

from dataclasses import dataclass
from datetime import datetime

OUTCOMES = ("processed", "retried", "dead", "duplicate")  # bottom to top
WIDTH = 720  # the plot's, in SVG units; the axis labels are outside it
HEIGHT = 160
LEFT = 48  # room for the counts' labels
BOTTOM = 22  # room for the times' labels
GAP = 2  # between two minutes' bars
TIME_LABEL_EVERY = 10  # minutes


@dataclass(frozen=True)
class Segment:
    outcome: str
    y: float
    height: float
    count: int


@dataclass(frozen=True)
class Bar:
    x: float
    width: float
    label: str  # "14:05 UTC: 12 processed, 1 retried"
    segments: list[Segment]


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    left: int
    plot_height: int
    scale_max: int
    bars: list[Bar]
    times: list[tuple[float, str]]  # (x, "14:00")
    totals: dict[str, int]
    minutes: list[dict]  # the rows, for the table

    @property
    def middle(self) -> str:
        """The label of the scale's middle line: 50, 2.5."""
        return f"{self.scale_max / 2:g}"

    @property
    def description(self) -> str:
        figures = ", ".join(f"{self.totals[outcome]} {outcome}" for outcome in OUTCOMES)
        busiest = max(self.minutes, key=_total)
        peak = f"; the busiest minute, {_time(busiest['minute'])} UTC, had {_total(busiest)}" if _total(busiest) else ""
        return f"In the last {len(self.minutes)} minutes: {figures}{peak}."


def chart(minutes: list[dict]) -> Chart:
    """`minutes`: oldest first, each with its `minute` and a count per outcome."""
    scale_max = nice_ceiling(max((_total(row) for row in minutes), default=0))
    step = WIDTH / max(len(minutes), 1)
    bars = [_bar(row, index * step, step, scale_max) for index, row in enumerate(minutes)]
    times = [
        (index * step, _time(row["minute"]))
        for index, row in enumerate(minutes)
        if row["minute"].minute % TIME_LABEL_EVERY == 0
    ]
    totals = {outcome: sum(row[outcome] for row in minutes) for outcome in OUTCOMES}
    return Chart(LEFT + WIDTH, HEIGHT + BOTTOM, LEFT, HEIGHT, scale_max, bars, times, totals, minutes)


def _bar(row: dict, x: float, step: float, scale_max: int) -> Bar:
    segments, bottom = [], float(HEIGHT)
    for outcome in OUTCOMES:
        if row[outcome]:
            height = row[outcome] / scale_max * HEIGHT
            bottom -= height
            segments.append(Segment(outcome, round(bottom, 2), round(height, 2), row[outcome]))
    said = ", ".join(f"{row[outcome]} {outcome}" for outcome in OUTCOMES if row[outcome]) or "nothing"
    return Bar(round(x, 2), round(step - GAP, 2), f"{_time(row['minute'])} UTC: {said}", segments)


def nice_ceiling(value: int) -> int:
    """The scale's top: 1, 2 or 5 times a power of ten, at least `value` (and 1)."""
    magnitude = 1
    while True:
        for factor in (1, 2, 5):
            if factor * magnitude >= value:
                return factor * magnitude
        magnitude *= 10


def _total(row: dict) -> int:
    return sum(row[outcome] for outcome in OUTCOMES)


def _time(minute: datetime) -> str:
    return minute.strftime("%H:%M")
