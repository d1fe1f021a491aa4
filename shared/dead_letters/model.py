"""Dead letters (docs/reference.md §8): what workers give up on, for on-call.

Workers record (`record_dead_letter`); `webhook-ingest dlq …`, the admin
HTTP API and the on-call console list, show, replay and discard through
one `DeadLetterStore` (`shared/dead_letters/store.py`). Every replay and
discard says who did it (an `Actor`) and lands in `audit_log`; a replay
also adds to the dead letter's own history (`dead_letter_replays`) instead
of overwriting it. The JSON shapes of docs/reference.md §2 are defined here
once (`summary`, `detail`) so the CLI and the API cannot drift apart.

The raw body is kept as received (`body`, bytea): a replay publishes exactly
those bytes. `payload` (jsonb) is only the readable copy, NULL when the
body is not JSON that Postgres can store.
"""

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg

from webhook_ingest.shared import storable_json
from webhook_ingest.shared.db import iso_utc, jsonb, load_queries
from webhook_ingest.shared.errors import WebhookIngestError
from webhook_ingest.shared.event import EventMessage

SQL = load_queries("webhook_ingest.shared.dead_letters")

STATUSES = ("dead", "replayed", "discarded", "completed")  # completed: by another delivery, after all
MAX_ID = 2**63 - 1  # bigserial
MAX_ID_DIGITS = len(str(MAX_ID))
UNREADABLE = "UnreadableMessage"  # the error type of a message that was not an event: never replayable


class DeadLetterError(WebhookIngestError):
    """The dead-letter operation failed."""


class DeadLetterNotFound(DeadLetterError):
    """No such dead letter."""

    def __init__(self, ids: Iterable[int]):
        self.ids = sorted(ids)
        super().__init__(f"no dead letter with id {', '.join(map(str, self.ids))}")


class InvalidStatus(DeadLetterError):
    """Unknown dead-letter status."""


class NotReplayable(DeadLetterError):
    """Not an event message (recorded by the poison drainer as UnreadableMessage): discard it."""

    def __init__(self, ids: Iterable[int]):
        self.ids = sorted(ids)
        super().__init__(
            f"dead letter {', '.join(map(str, self.ids))} is not an event message and cannot be replayed (discard it)"
        )


class ChangedMeanwhile(DeadLetterError):
    """Someone else replayed or discarded it since it was shown: nothing done."""

    def __init__(self, dead_letter_id: int, status: str):
        self.dead_letter_id, self.status = dead_letter_id, status
        super().__init__(f"dead letter {dead_letter_id} was {status} meanwhile; nothing was done")


class ReplayInterrupted(DeadLetterError):
    """The broker failed during a replay; the ids named were replayed before it did."""

    def __init__(self, replayed: Sequence[int], cause: BaseException):
        self.replayed = list(replayed)
        done = f"replayed {len(self.replayed)} ({', '.join(map(str, self.replayed))})" if replayed else "replayed none"
        super().__init__(f"broker failed during replay, {done}: {type(cause).__name__}: {cause}")


@dataclass(frozen=True)
class Replayed:
    """What one replay did: the dead letters it published, and those it
    skipped because someone else replayed or discarded them (or a copy
    completed them) after it read them."""

    replayed: list[int]
    skipped: list[int]


# -- recording -----------------------------------------------------------------


async def record_dead_letter(
    conn: asyncpg.Connection, event: EventMessage, errors: Sequence[dict], timeout: float | None = None
) -> int | None:
    """One dead letter for `event`, whose failed attempts are `errors`; its
    id. An event that already has an open one keeps it (a redelivery after a
    crash between this commit and the ack): no second row. None, recording
    nothing, when the event has completed meanwhile (another copy)."""
    return await conn.fetchval(
        SQL["insert_dead_letter"],
        event.key,
        event.source,
        event.event_id,
        event.payload_sha256,
        event.body,
        storable_payload(event.body),
        jsonb(event.headers),
        datetime.fromtimestamp(event.received_at, UTC),
        event.attempt,
        jsonb(list(errors)),
        event.route or None,
        event.arrival,
        timeout=timeout,
    )


def storable_payload(body: bytes) -> str | None:
    """The body as JSON text jsonb accepts, or None: the raw body is kept
    anyway, so a dead letter can always be recorded (`shared.storable_json`
    says what jsonb refuses)."""
    try:
        storable_json.parse(body)
    except ValueError:
        return None
    return body.decode()


# -- reading -------------------------------------------------------------------


@dataclass(frozen=True)
class DeadLetterFilter:
    """The console's filter; None is "any". `text` is looked for, case
    insensitively and literally, in the key and the last error's message."""

    source: str | None = None
    status: str | None = "dead"
    error_type: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    text: str | None = None

    def as_json(self) -> dict:
        return {
            name: iso_utc(value) if isinstance(value, datetime) else value
            for name, value in asdict(self).items()
            if value is not None
        }


def parse_id(text: str) -> int | None:
    """A dead-letter id from user input, or None when it cannot be one."""
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > MAX_ID_DIGITS:  # no sign, no spaces
        return None  # length first: int() refuses more than 4,300 digits (a 500, issue 21)
    if int(text) > MAX_ID:
        return None
    return int(text)


_JSONB_COLUMNS = ("payload", "headers", "errors", "last_error")


def decoded(row: asyncpg.Record) -> dict:
    """A row as a dict, jsonb columns parsed (json, not orjson: payloads may
    hold integers wider than 64 bits, which jsonb keeps exactly)."""
    record = dict(row)
    for column in _JSONB_COLUMNS:
        if isinstance(record.get(column), str):
            record[column] = json.loads(record[column])
    return record


# -- acting --------------------------------------------------------------------


def rebuilt_event(row: asyncpg.Record, replay_id: int) -> EventMessage:
    """The event as the ingress queued it, with a new attempt budget: a new
    retry chain, named after the replay (dead_letter_replays.id) that starts it."""
    headers = row["headers"]
    return EventMessage(
        key=row["key"],
        source=row["source"],
        event_id=row["event_id"],
        payload_sha256=row["payload_sha256"],
        received_at=row["received_at"].timestamp(),
        body=bytes(row["body"]),
        headers=json.loads(headers) if isinstance(headers, str) else dict(headers),
        route=row.get("route") or "",  # its route alone runs again
        arrival=row["arrival"],  # the archive's row it writes over
    ).fresh(replay_of=replay_id)


# -- the JSON shapes of docs/reference.md §2 --------------------------------------------------


def summary(row: Mapping[str, Any]) -> dict:
    """One line of `dlq list --json` / `GET /admin/dead-letters`."""
    return {
        "id": int(row["id"]),
        "key": row["key"],
        "source": row["source"],
        "event_id": row["event_id"],
        **({"route": row["route"]} if row.get("route") else {}),  # a route's run (KEY#ROUTE)
        "status": row["status"],
        "attempts": row["attempts"],
        "last_error": describe_error(row["last_error"]),
        "created_at": iso_utc(row["created_at"]),
        "updated_at": iso_utc(row["updated_at"]),
    }


def detail(row: Mapping[str, Any]) -> dict:
    """`dlq show ID --json` / `GET /admin/dead-letters/{id}`: the summary plus
    everything on-call needs to decide."""
    document = summary(row) | {
        "received_at": iso_utc(row["received_at"]),
        "payload_sha256": row["payload_sha256"],
        "payload": row["payload"],
        "headers": row["headers"],
        "errors": [_error_entry(error) for error in row["errors"]],
    }
    if row["payload"] is None:  # not JSON: show the raw body as text instead
        document["body"] = bytes(row["body"]).decode(errors="replace")
    return document


def describe_error(error: dict | None) -> str | None:
    """ "Type: message" (just "Type" when the message is empty)."""
    if not error:
        return None
    kind, message = error.get("type") or "Error", error.get("message") or ""
    return f"{kind}: {message}" if message else kind


def _error_entry(error: dict) -> dict:
    entry = {name: error.get(name) for name in ("attempt", "at", "type", "message")}
    for optional in ("traceback", "trace_id"):  # trace_id: the attempt's OpenTelemetry trace, when it ran in one
        if error.get(optional):
            entry[optional] = error[optional]
    return entry
