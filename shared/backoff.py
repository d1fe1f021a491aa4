"""Waiting for a service to come back: pauses that double up to a ceiling."""

from collections.abc import Iterator


def pauses(first: float = 0.2, most: float = 5.0) -> Iterator[float]:
    """`first`, twice that, four times … then `most` for ever: the seconds to
    wait before each next try, so an outage costs a try every few seconds
    rather than a busy loop, and a blip costs a fraction of a second."""
    pause = first
    while True:
        yield pause
        pause = min(pause * 2, most)
