"""The dead-letter store (docs/reference.md §8): what workers give up on, for on-call.

Workers record; `webhook-ingest dlq …` and the admin HTTP API list, show,
replay and discard. The JSON shapes of docs/reference.md §2 are defined here once
(`summary`, `detail`) so the CLI and the API cannot drift apart.

Every function takes an asyncpg connection (or pool). The raw body is kept as
received (`body`, bytea): a replay publishes exactly those bytes. `payload`
(jsonb) is only the readable copy, NULL when the body is not JSON that
Postgres can store.
"""

import contextlib
import json
from collections.abc import AsyncIterator, Iterable, Sequence
from datetime import UTC, datetime

import orjson

from webhook_ingest.shared import topology
from webhook_ingest.shared.errors import WebhookIngestError
from webhook_ingest.shared.message import EventMessage, to_amqp
from webhook_ingest.shared.queries import load_queries

SQL = load_queries("webhook_ingest.shared")
STATUSES = ("dead", "replayed", "discarded")
REPLAY_PUBLISH_TIMEOUT = 10.0
MAX_ID = 2**63 - 1  # bigserial
UNREADABLE = "UnreadableMessage"  # the error type of a message that was not ours (workers.poison)


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
        super().__init__(f"dead letter {', '.join(map(str, self.ids))} is not an event message and cannot be"
                         " replayed (discard it)")


class ReplayInterrupted(DeadLetterError):
    """The broker failed during a replay; the ids named were replayed before it did."""

    def __init__(self, replayed: Sequence[int], cause: BaseException):
        self.replayed = list(replayed)
        done = f"replayed {len(self.replayed)} ({', '.join(map(str, self.replayed))})" if replayed else "replayed none"
        super().__init__(f"broker failed during replay, {done}: {type(cause).__name__}: {cause}")


# -- recording -----------------------------------------------------------------


async def record_dead_letter(conn, event: EventMessage, errors: Sequence[dict]) -> int:
    """One dead letter for `event`, whose failed attempts are `errors`; its
    id. An event that already has an open one keeps it (a redelivery after a
    crash between this commit and the ack): no second row."""
    return await conn.fetchval(
        SQL["insert_dead_letter"],
        event.key,
        event.source,
        event.event_id,
        event.payload_sha256,
        event.body,
        storable_payload(event.body),
        _jsonb(event.headers),
        datetime.fromtimestamp(event.received_at, UTC),
        event.attempt,
        _jsonb(list(errors)),
    )


def storable_payload(body: bytes) -> str | None:
    """The body as JSON text jsonb accepts, or None (not UTF-8, not JSON,
    NaN/Infinity, or a NUL character, which jsonb refuses)."""
    try:
        text = body.decode()
        json.loads(text, parse_constant=_refuse)
    except (ValueError, RecursionError):
        return None
    return None if "\\u0000" in text else text


def _refuse(constant: str):
    raise ValueError(f"{constant} is not JSON")


def _jsonb(value) -> str:
    return orjson.dumps(value, default=str).replace(b"\\u0000", b"\\ufffd").decode()


# -- reading -------------------------------------------------------------------


async def list_dead_letters(conn, source: str | None = None, status: str = "dead", limit: int | None = None) -> list[dict]:
    """Newest first; `status` one of STATUSES or "all"."""
    rows = await conn.fetch(SQL["list_dead_letters"], source, _status_filter(status), limit)
    return [_decoded(row) for row in rows]


async def get_dead_letter(conn, dead_letter_id: int) -> dict | None:
    row = await conn.fetchrow(SQL["get_dead_letter"], dead_letter_id)
    return None if row is None else _decoded(row)


async def count_open(conn) -> int:
    return await conn.fetchval(SQL["count_open_dead_letters"])


def parse_id(text: str) -> int | None:
    """A dead-letter id from user input, or None when it cannot be one."""
    text = text.strip()
    if not (text.isascii() and text.isdigit()) or int(text) > MAX_ID:  # no sign, no spaces
        return None
    return int(text)


def _status_filter(status: str) -> str | None:
    if status == "all":
        return None
    if status not in STATUSES:
        raise InvalidStatus(f"unknown status {status!r} (one of {', '.join(STATUSES)}, all)")
    return status


_JSONB_COLUMNS = ("payload", "headers", "errors", "last_error")


def _decoded(row) -> dict:
    """A row as a dict, jsonb columns parsed (json, not orjson: payloads may
    hold integers wider than 64 bits, which jsonb keeps exactly)."""
    record = dict(row)
    for column in _JSONB_COLUMNS:
        if isinstance(record.get(column), str):
            record[column] = json.loads(record[column])
    return record


# -- acting --------------------------------------------------------------------


async def mark_replayed(conn, ids: Sequence[int]) -> list[int]:
    return [row["id"] for row in await conn.fetch(SQL["set_dead_letter_status"], list(ids), "replayed")]


async def discard(conn, ids: Sequence[int]) -> list[int]:
    """Marks them discarded (kept for audit); all or nothing: an unknown id
    raises DeadLetterNotFound and changes nothing."""
    async with _connection(conn) as connection, connection.transaction():
        discarded = await connection.fetch(SQL["set_dead_letter_status"], list(ids), "discarded")
        _require_all_found(ids, discarded)
    return [row["id"] for row in discarded]


@contextlib.asynccontextmanager
async def _connection(conn_or_pool) -> AsyncIterator:
    if hasattr(conn_or_pool, "acquire"):  # a pool
        async with conn_or_pool.acquire() as connection:
            yield connection
    else:
        yield conn_or_pool


async def replay(conn, channel, namespace: str, ids: Sequence[int] | None = None, all_: bool = False,
                 source: str | None = None) -> list[int]:
    """Publish dead letters back to the events queue with a fresh attempt
    budget: the given `ids`, or with `all_` every open one (of `source`).
    Unknown ids raise DeadLetterNotFound before anything is published.

    `channel` must be in confirm mode: a row is marked replayed only after
    the broker confirmed its message. A crash between the two leaves it
    `dead` though it was published; replaying it again publishes a second
    copy, which the workers' idempotency (same key, same payload) makes a
    harmless duplicate.
    """
    rows = await conn.fetch(SQL["dead_letters_to_replay"], list(ids or ()), all_, source)
    _require_all_found(ids or (), rows)
    rows = _replayable(rows, refuse=not all_)
    replayed: list[int] = []
    for row in rows:
        try:
            await topology.publish(channel, to_amqp(rebuilt_event(row)), topology.events_queue(namespace),
                                   timeout=REPLAY_PUBLISH_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - any broker failure: report what was done
            raise ReplayInterrupted(replayed, exc) from exc
        replayed += await mark_replayed(conn, [row["id"]])
    return replayed


def _replayable(rows, refuse: bool) -> list:
    """Rows that are events; the others raise NotReplayable when `refuse`
    (explicit ids), else are left dead (`--all`)."""
    unreadable = [row["id"] for row in rows if row["last_error_type"] == UNREADABLE]
    if unreadable and refuse:
        raise NotReplayable(unreadable)
    return [row for row in rows if row["last_error_type"] != UNREADABLE]


def _require_all_found(ids: Iterable[int], rows) -> None:
    missing = set(ids) - {row["id"] for row in rows}
    if missing:
        raise DeadLetterNotFound(missing)


def rebuilt_event(row) -> EventMessage:
    """The event as the ingress queued it, with a new attempt budget."""
    headers = row["headers"]
    return EventMessage(
        key=row["key"],
        source=row["source"],
        event_id=row["event_id"],
        payload_sha256=row["payload_sha256"],
        received_at=row["received_at"].timestamp(),
        body=bytes(row["body"]),
        headers=json.loads(headers) if isinstance(headers, str) else dict(headers),
    ).fresh()


# -- the JSON shapes of docs/reference.md §2 --------------------------------------------------


def summary(row) -> dict:
    """One line of `dlq list --json` / `GET /admin/dead-letters`."""
    return {
        "id": int(row["id"]),
        "key": row["key"],
        "source": row["source"],
        "event_id": row["event_id"],
        "status": row["status"],
        "attempts": row["attempts"],
        "last_error": describe_error(row["last_error"]),
        "created_at": iso_utc(row["created_at"]),
        "updated_at": iso_utc(row["updated_at"]),
    }


def detail(row) -> dict:
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
    """"Type: message" (just "Type" when the message is empty)."""
    if not error:
        return None
    kind, message = error.get("type") or "Error", error.get("message") or ""
    return f"{kind}: {message}" if message else kind


def _error_entry(error: dict) -> dict:
    entry = {name: error.get(name) for name in ("attempt", "at", "type", "message")}
    if error.get("traceback"):
        entry["traceback"] = error["traceback"]
    return entry


def iso_utc(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


def to_json(document) -> bytes:
    """One JSON document. orjson, unless a payload holds an integer wider than
    64 bits (orjson refuses those; the standard library writes them exactly)."""
    try:
        return orjson.dumps(document)
    except orjson.JSONEncodeError:
        return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
