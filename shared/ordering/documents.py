"""The JSON documents of ordering keys (docs/reference.md §2, §8): a blocked
lane, one lane's state. `webhook-ingest ordering … --json` and the admin API
answer with these, defined once so the two cannot drift apart."""

from datetime import datetime
from decimal import Decimal

from webhook_ingest.shared.db import iso_utc

from .model import BlockedLane, LaneRow, LaneState


def blocked_document(blocked: BlockedLane) -> dict:
    """One line of `ordering blocked --json` / `GET /admin/ordering/blocked`."""
    return {
        "lane": blocked.lane,
        "source": blocked.source,
        "route": blocked.route or None,
        "value": blocked.value,
        "since": iso_utc(blocked.since),
        "age_seconds": round(blocked.age_seconds, 1),
        "dead_letter_id": blocked.dead_letter_id,
        "waiting": blocked.waiting,
    }


def lane_document(state: LaneState) -> dict:
    """`ordering show LANE --json` / `GET /admin/ordering/lanes/{lane}`."""
    return {
        "lane": state.lane,
        "source": state.source,
        "route": state.route or None,
        "value": state.value,
        "seqs_given": state.next_seq,
        "pending": state.pending,
        "holder": state.holder if state.held else None,
        "lease_until": _iso(state.lease_until),
        "token": state.token,
        "ready_at": _iso(state.ready_at),
        "last_by": _number(state.last_by),
        "blocked_by": state.blocked_by,
        "blocked_since": _iso(state.blocked_since),
        "rows": [_row(row) for row in state.rows],
    }


def _row(row: LaneRow) -> dict:
    return {
        "seq": row.seq,
        "key": row.key,
        "state": row.state,
        "by": _number(row.by_value),
        "accepted_at": iso_utc(row.accepted_at),
        "attempt": row.attempt,
        "replay_of": row.replay_of,
        "deliveries": row.deliveries,
        "dead_letter_id": row.dead_letter_id,
    }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else iso_utc(moment)


def _number(value: Decimal | None) -> int | float | None:
    """A `by` as JSON writes numbers: an integer as one."""
    if value is None:
        return None
    return int(value) if value == value.to_integral_value() else float(value)
