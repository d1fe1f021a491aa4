"""Replays of archived events by selection (docs/reference.md §8, "Replaying
archived events"): "replay every invoice.paid of stripe received between
14:00 and 15:10".

A replay is asked with the archive search's filter (`shared/archive/search.py`).
A dry run counts the events it would take; preparing freezes them — the keys
the filter matches at that moment, one arrival each, in the order received
(`event_replay_items`) — and only those are ever published, never an event
that arrives after. It is then run, paced, by the shared machinery of the
dead letters' bulk actions (`shared/runs/paced.py`): cancellable from any
process, resumable, audited. Replay R publishes each event under the key
`replay-R/KEY` (`shared/replays/keys.py`), which is what makes it run once
per replay. The rows are read and written by `EventReplayStore`.

An ordered source's events (docs/design.md, "Ordering keys") are not
published: each item is appended to its *live* lane (`ordered_parts`), in
the item's own transaction, so items go in selection order, each after
whatever its lane held when it was inserted; under `stale = "skip"` only
each lane's newest (by `by`) runs, the older ones completed `stale`.
"""

import json
from dataclasses import dataclass
from datetime import UTC, datetime

import asyncpg
import orjson

from webhook_ingest.shared.archive import EventFilter
from webhook_ingest.shared.db import iso_utc
from webhook_ingest.shared.event import EventMessage
from webhook_ingest.shared.ordering import OrderedRow
from webhook_ingest.shared.sources import Source, laned

from .keys import replay_key

STATES = ("prepared", "running", "done", "failed", "cancelled")
STALLED_SECONDS = 30.0  # and two intervals with no step: its process died (claim_event_replay takes it back)


@dataclass(frozen=True)
class EventReplay:
    id: int
    filter: dict
    total: int
    state: str
    rate: float | None
    next_item: int
    published: int
    skipped: int
    error: str | None
    created_by: str
    created_at: datetime
    started_at: datetime | None
    stepped_at: datetime | None
    finished_at: datetime | None
    in_doubt: bool = False  # a Cancel counted an item published its runner (dead mid-publish) never stepped

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> "EventReplay":
        record = dict(row)
        record["filter"] = json.loads(record["filter"])
        return cls(**record)

    @property
    def handled(self) -> int:
        return self.next_item - 1

    @property
    def resumable(self) -> bool:
        """Stopped with the reason (`failed`), or `running` with no step for
        STALLED_SECONDS and two intervals: the process running it died."""
        if self.state == "failed":
            return True
        if self.state != "running" or self.stepped_at is None or not self.rate:
            return False
        return (datetime.now(UTC) - self.stepped_at).total_seconds() > STALLED_SECONDS + 2 / self.rate

    def document(self) -> dict:
        """`events replay --show --json` / `GET /admin/events/replay/{id}`."""
        return {
            "id": self.id,
            "state": self.state,
            "filter": self.filter,
            "total": self.total,
            "handled": self.handled,
            "published": self.published,
            "in_doubt": int(self.in_doubt),
            "skipped": self.skipped,
            "rate": self.rate,
            "error": self.error,
            "created_by": self.created_by,
            "created_at": iso_utc(self.created_at),
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
        }


@dataclass(frozen=True)
class ReplayItem:
    """One frozen event of a replay: its number, and its arrival in the archive."""

    item: int
    source: str
    key: str
    received_at: datetime


def filter_json(where: EventFilter) -> dict:
    """The filter as asked, for the replay's row and the audit log."""
    names = {
        "source": "source",
        "status": "status",
        "event_type": "type",
        "since": "since",
        "until": "until",
        "key": "key",
        "event_id": "event_id",
        "payload": "payload",
    }
    return {
        label: iso_utc(value) if isinstance(value, datetime) else value
        for name, label in names.items()
        if (value := getattr(where, name)) is not None
    }


def replayed_message(arrival: asyncpg.Record, replay_id: int) -> EventMessage:
    """The archived arrival as the ingress queued it, under replay `replay_id`'s
    key: attempt 1 of a chain of its own. No route: a routed source's worker
    fans it out to every route that takes it (`replay-R/KEY#ROUTE`)."""
    headers = arrival["headers"]
    return EventMessage(
        key=replay_key(arrival["key"], replay_id),
        source=arrival["source"],
        event_id=arrival["event_id"],
        payload_sha256=arrival["payload_sha256"],
        received_at=arrival["received_at"].timestamp(),
        body=bytes(arrival["body"]),
        headers=json.loads(headers) if isinstance(headers, str) else dict(headers or {}),
    )


def ordered_parts(source: Source | None, message: EventMessage) -> tuple[tuple[OrderedRow, ...], EventMessage | None]:
    """A replayed event's rows in its ordered lanes, and the message still to
    publish for the rest (None: nothing is), as the ingress decides
    (shared/sources/lanes.py). `source` None: not in the sources file,
    published as it is (the CLI refuses a selection of a source with lanes it
    cannot read)."""
    if source is None:
        return (), message
    found = laned(source, message, _payload(message.body))
    return found.rows, found.unordered


def _payload(body: bytes) -> object:
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else iso_utc(moment)
