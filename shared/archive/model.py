"""The event archive, as plain code (docs/design.md, "The archive"): what its
rows hold, the tables a source's rows live in, and which days they keep.

Every accepted arrival of an event is one row of `event_archive`: the
ingress writes it (body, headers, type; status `queued`, or `duplicate`
when it answered so, or `ignored` with the `ignore` rule that matched:
never queued, that row is its end), the workers write what became of it
(`retrying`, `processed`, `stale`, `dead`, `conflict`, `duplicate`), a discard of
its dead letter makes it `discarded`. A row is named by (source, key,
received_at, arrival), which the message carries, so each side writes its
part without reading first: the arrival's own id (shared/event/message.py), drawn
by the ingress, keeps two copies stamped with the same millisecond apart.

The table is partitioned by source (LIST), each source's part by day of
`received_at` (RANGE, UTC): a source keeps its own `retention`, and a day
older than that is one DROP TABLE, never a DELETE.
"""

import hashlib
import re
from datetime import UTC, date, datetime, timedelta

from webhook_ingest.shared.event import EventMessage

DAYS_AHEAD = 3  # days created in advance: the upkeep may miss that many before a row finds no day
_NAME_CHARS = re.compile(r"[^a-z0-9]+")

# Statuses a row stores (`processing` is not stored: a queued row whose key's lease is held).
QUEUED, RETRYING, PROCESSED, DEAD, DISCARDED, CONFLICT, DUPLICATE, IGNORED, STALE = (
    "queued",
    "retrying",
    "processed",
    "dead",
    "discarded",
    "conflict",
    "duplicate",
    "ignored",
    "stale",  # an ordered event completed unrun, older than its lane's last (`stale = "skip"`): an end as processed
)
ENDS_RUN = (PROCESSED, STALE)  # the completion of the arrival itself: one per run


def source_table(source: str) -> str:
    """The table holding `source`'s rows: readable, unique per source (a
    hash of the whole name), and room left for a day's suffix within
    Postgres's 63 bytes."""
    readable = _NAME_CHARS.sub("_", source.lower()).strip("_")[:24]
    return f"event_archive_{readable}_{hashlib.sha256(source.encode()).hexdigest()[:8]}"


def day_table(source: str, day: date) -> str:
    return f"{source_table(source)}_{day:%Y%m%d}"


def kept_days(now: datetime, retention: timedelta) -> tuple[date, date, date]:
    """(the oldest day kept, the first and the last day to have a table).

    A day's table goes once the whole day is older than `retention`, so a
    row is kept at least that long and at most a day more. Tables are made
    from yesterday (rows written late, across midnight) to DAYS_AHEAD days
    ahead; an older day is not made again once gone. A retention of 0
    keeps nothing and makes nothing."""
    today = now.astimezone(UTC).date()
    if not retention:
        return today + timedelta(days=DAYS_AHEAD + 1), today, today - timedelta(days=1)
    oldest = (now - retention).astimezone(UTC).date()
    return oldest, max(oldest, today - timedelta(days=1)), today + timedelta(days=DAYS_AHEAD)


def received_ms(event: EventMessage) -> int:
    """The receive time as the message carries it (shared/event/message.py:
    integer milliseconds), so the ingress and the workers name one row."""
    return round(event.received_at * 1000)


def row_key(row: tuple) -> tuple:
    """(source, key, received_ms, arrival): the first four columns of every row below."""
    return row[:4]


def arrival_row(
    event: EventMessage, event_type: str | None, headers_json: str, status: str, ignore_rule: str | None = None
) -> tuple:
    """The ingress's row, in the columns of `archive_arrivals`; `ignore_rule` only with IGNORED."""
    return (
        event.source,
        event.key,
        received_ms(event),
        event.arrival,
        event.event_id,
        event_type,
        event.payload_sha256,
        event.body,
        headers_json,
        status,
        ignore_rule,
    )


def outcome_row(event: EventMessage, status: str, at: float, error: str | None = None) -> tuple:
    """A worker's row, in the columns of `archive_outcomes`; `at` in unix seconds. A route's
    run is noted under its event's key, with its route: its completion's key is KEY#ROUTE."""
    return (
        event.source,
        event.key,
        received_ms(event),
        event.arrival,
        event.event_id,
        event.payload_sha256,
        status,
        event.replay_of,
        event.attempt,
        error,
        round(at * 1000),
        event.route or None,
    )


def rounds(rows: list[tuple]) -> list[list[tuple]]:
    """`rows` in statements without a row twice, in order: one INSERT … ON
    CONFLICT DO UPDATE may not touch a row twice, and each later round is
    judged against what the earlier one wrote."""
    batches: list[list[tuple]] = []
    placed: list[set[tuple]] = []
    for row in rows:
        slot = next((n for n, keys in enumerate(placed) if row_key(row) not in keys), len(batches))
        if slot == len(batches):
            batches.append([])
            placed.append(set())
        batches[slot].append(row)
        placed[slot].add(row_key(row))
    return batches


def columns(rows: list[tuple]) -> list[list]:
    """A statement's arguments: one list per column."""
    return [list(column) for column in zip(*rows)]
