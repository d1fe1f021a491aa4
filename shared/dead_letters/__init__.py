"""webhook_ingest.shared.dead_letters: what each of its modules holds.

- model  Dead letters (docs/reference.md §8): what workers give up on, for on-call.
- store  The dead-letter store
- bulk   Bulk actions on dead letters ("Replay all matching" / "Discard all matching").
"""

from .bulk import BulkAction
from .model import (
    MAX_ID,
    STATUSES,
    UNREADABLE,
    ChangedMeanwhile,
    DeadLetterFilter,
    DeadLetterNotFound,
    NotReplayable,
    Replayed,
    ReplayInterrupted,
    describe_error,
    detail,
    parse_id,
    record_dead_letter,
    summary,
)
from .store import DeadLetterStore, HeldBulk, LaneWaker, wake_lanes

__all__ = [
    "MAX_ID",
    "STATUSES",
    "UNREADABLE",
    "BulkAction",
    "ChangedMeanwhile",
    "DeadLetterFilter",
    "DeadLetterNotFound",
    "DeadLetterStore",
    "HeldBulk",
    "LaneWaker",
    "NotReplayable",
    "ReplayInterrupted",
    "Replayed",
    "bulk",
    "describe_error",
    "detail",
    "parse_id",
    "record_dead_letter",
    "summary",
    "wake_lanes",
]
