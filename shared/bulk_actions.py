"""Bulk actions on dead letters ("Replay all matching" / "Discard all matching").

The set is frozen when the operator asks: the ids the filter matches then
are stored with the action, and only those are ever acted on — never a row
that failed after, never one the filter hid. Progress lives in Postgres, not
in a process, so any ingress process behind the same port shows it.
"""

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import orjson

from webhook_ingest.shared.dead_letters import SQL, Actor, DeadLetterFilter

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

    @classmethod
    def from_row(cls, row) -> "BulkAction":
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


async def prepare(conn, action: str, ids: Sequence[int], where: DeadLetterFilter, actor: Actor) -> int:
    """A new bulk action over exactly `ids`, waiting for its confirmation."""
    return await conn.fetchval(SQL["insert_bulk_action"], action, list(ids),
                              orjson.dumps(where.as_json()).decode(), str(actor))


async def get(conn, bulk_action_id: int) -> BulkAction | None:
    row = await conn.fetchrow(SQL["get_bulk_action"], bulk_action_id)
    return None if row is None else BulkAction.from_row(row)


async def claim(conn, bulk_action_id: int, rate: float) -> BulkAction | None:
    """Running at `rate` per second, if it was waiting (prepared, or failed
    half way); None when it runs already, finished or was cancelled."""
    row = await conn.fetchrow(SQL["claim_bulk_action"], bulk_action_id, rate)
    return None if row is None else BulkAction.from_row(row)


async def step(conn, bulk_action_id: int, dead_letter_id: int, acted: bool) -> None:
    await conn.execute(SQL["bulk_action_step"], bulk_action_id, dead_letter_id, acted)


async def finish(conn, bulk_action_id: int, state: str, error: str | None = None) -> None:
    await conn.execute(SQL["finish_bulk_action"], bulk_action_id, state, error)


async def cancel(conn, bulk_action_id: int) -> bool:
    return await conn.fetchval(SQL["cancel_bulk_action"], bulk_action_id) is not None


async def state_of(conn, bulk_action_id: int) -> str | None:
    return await conn.fetchval(SQL["bulk_action_state"], bulk_action_id)
