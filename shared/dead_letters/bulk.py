"""Bulk actions on dead letters ("Replay all matching" / "Discard all matching").

The set is frozen when the operator asks: the ids the filter matches then
are stored with the action, and only those are ever acted on — never a row
that failed after, never one the filter hid. Progress lives in Postgres, not
in a process, so any ingress process behind the same port shows it. The
rows are read and written by `DeadLetterStore` (`shared/dead_letters/store.py`).
"""

import json
from dataclasses import dataclass, field
from datetime import datetime

import asyncpg

ACTIONS = ("replay", "discard")


@dataclass(frozen=True)
class BulkAction:
    id: int
    action: str
    dead_letter_ids: list[int]
    filter: dict
    state: str
    rate: float | None
    done: list[int]
    skipped: list[int]
    error: str | None
    created_by: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    in_doubt: list[int] = field(default_factory=list)  # counted done by a Cancel, never stepped (its runner died)

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> "BulkAction":
        record = dict(row)
        record["filter"] = json.loads(record["filter"])
        return cls(**record)

    @property
    def remaining(self) -> list[int]:
        handled = set(self.done) | set(self.skipped)
        return [dead_letter_id for dead_letter_id in self.dead_letter_ids if dead_letter_id not in handled]

    @property
    def handled(self) -> int:
        return len(self.done) + len(self.skipped)
