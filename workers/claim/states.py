"""The idempotency model as plain code: what a key's claim can say, and what
became of an event. The Redis and Postgres steps live beside it
(`idempotency.py`, `lease.py`, `processor.py`).

A key moves FREE -> IN_FLIGHT (claimed, lock held) -> COMPLETED (completion
row committed). IN_FLIGHT falls back to FREE when its holder fails, releases
or dies (the lock's TTL). COMPLETED is final: Postgres' `processed_events` is
the truth; Redis only remembers it to answer duplicates early.
"""

import enum


class ClaimState(enum.Enum):
    ACQUIRED = "acquired"  # we hold the processing lock
    COMPLETED = "completed"  # a completion is known: duplicate (or conflict)
    BUSY = "busy"  # another worker holds the key in flight
    UNAVAILABLE = "unavailable"  # Redis has no quorum: degraded mode, Postgres alone


class Outcome(enum.Enum):
    """Values are the `outcome` label of `webhook_events_total`."""

    PROCESSED = "processed"
    DUPLICATE = "duplicate"
    CONFLICT = "conflict"
    RETRIED = "retried"
    DEAD = "dead"
    DEFERRED = "deferred"  # in flight elsewhere: comes back after a short delay
    PARKED = "parked"  # its source is paused: kept in NS.paused.<source> until resumed
    ROUTED = "routed"  # its source has routes: one message per route taking it was queued
    UNROUTED = "unrouted"  # its source has routes and none takes it: nothing to run
    STALE = "stale"  # ordered, `by` older than its lane's last processed, stale = "skip": completed unrun


def classify_completed(completed_sha256: str, payload_sha256: str) -> Outcome:
    """A key already completed is a duplicate, unless its payload differs."""
    return Outcome.DUPLICATE if completed_sha256 == payload_sha256 else Outcome.CONFLICT
