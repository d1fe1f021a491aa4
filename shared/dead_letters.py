"""The dead-letter store (docs/reference.md §8): what workers give up on, for on-call.

Workers record; `webhook-ingest dlq …`, the admin HTTP API and the on-call
console list, show, replay and discard. Every replay and discard says who
did it (an `Actor`) and lands in `audit_log`; a replay also adds to the dead
letter's own history (`dead_letter_replays`) instead of overwriting it.
The JSON shapes of docs/reference.md §2 are defined here once (`summary`,
`detail`) so the CLI and the API cannot drift apart.

Every function takes an asyncpg connection (or pool). The raw body is kept as
received (`body`, bytea): a replay publishes exactly those bytes. `payload`
(jsonb) is only the readable copy, NULL when the body is not JSON that
Postgres can store.
"""

import asyncio
import contextlib
import getpass
import json
import os
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

import orjson
from aio_pika.abc import AbstractChannel

from webhook_ingest.shared import metrics, storable_json, topology
from webhook_ingest.shared.errors import WebhookIngestError, describe
from webhook_ingest.shared.logging import get_logger
from webhook_ingest.shared.message import EventMessage, to_amqp
from webhook_ingest.shared.queries import load_queries

log = get_logger(__name__)
SQL = load_queries("webhook_ingest.shared")
STATUSES = ("dead", "replayed", "discarded", "completed")  # completed: by another delivery, after all
REPLAY_PUBLISH_TIMEOUT = 10.0
GAUGE_REFRESH_SECONDS = 15.0
ACQUIRE_TIMEOUT = 5.0
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


# -- who acts ------------------------------------------------------------------


@dataclass(frozen=True)
class Actor:
    """Who replays or discards, for the audit log: a token's role
    (`operator`, `viewer`) through the `console` or the `admin-api`, or
    `cli` with the OS user who ran the command."""

    role: str
    via: str
    name: str | None = None

    @classmethod
    def cli(cls) -> "Actor":
        return cls("cli", "cli", os_user())

    def __str__(self) -> str:
        return f"{self.role}:{self.name}" if self.name else f"{self.role} ({self.via})"


UNKNOWN_ACTOR = Actor("unknown", "unknown")


def os_user() -> str:
    """The login name; a container without a passwd entry has only a uid."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid {os.getuid()}"


async def record_audit(conn, actor: Actor, action: str, ids: Sequence[int], detail: dict | None = None) -> int:
    return await conn.fetchval(SQL["insert_audit"], actor.role, actor.name, actor.via, action, list(ids),
                               _jsonb(detail or {}))


async def list_audit(
    conn, dead_letter_id: int | None = None, before: int | None = None, limit: int = 100
) -> list[dict]:
    """Newest first; only entries naming `dead_letter_id` when given."""
    rows = await conn.fetch(SQL["list_audit"], dead_letter_id, before, limit)
    return [dict(row) | {"detail": json.loads(row["detail"])} for row in rows]


async def replays_of(conn, dead_letter_id: int) -> list[dict]:
    """Every replay of the dead letter, oldest first: when, who, which bulk action."""
    return [dict(row) for row in await conn.fetch(SQL["replays_of"], dead_letter_id)]


# -- recording -----------------------------------------------------------------


async def record_dead_letter(conn, event: EventMessage, errors: Sequence[dict]) -> int | None:
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
        _jsonb(event.headers),
        datetime.fromtimestamp(event.received_at, UTC),
        event.attempt,
        _jsonb(list(errors)),
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


def _jsonb(value) -> str:
    """Headers and errors as jsonb text, whatever strings they hold: a lone
    surrogate (an undecodable header byte) or NUL becomes U+FFFD."""
    try:
        text = orjson.dumps(value, default=str)
    except TypeError:  # orjson refuses lone surrogates
        text = orjson.dumps(_clean(value), default=str)
    return text.replace(b"\\u0000", b"\\ufffd").decode()


def _clean(value):
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    if isinstance(value, dict):
        return {_clean(str(key)): _clean(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(item) for item in value]
    return value


# -- reading -------------------------------------------------------------------


async def list_dead_letters(
    conn, source: str | None = None, status: str = "dead", limit: int | None = None
) -> list[dict]:
    """Newest first; `status` one of STATUSES or "all"."""
    rows = await conn.fetch(SQL["list_dead_letters"], source, _status_filter(status), limit)
    return [_decoded(row) for row in rows]


async def get_dead_letter(conn, dead_letter_id: int) -> dict | None:
    row = await conn.fetchrow(SQL["get_dead_letter"], dead_letter_id)
    return None if row is None else _decoded(row)


async def count_open(conn) -> int:
    return await conn.fetchval(SQL["count_open_dead_letters"])


async def keep_open_gauge(pool, every: float = GAUGE_REFRESH_SECONDS) -> None:
    """Forever (the ingress and each worker run it): `webhook_dead_letters_open`
    follows the table; a Postgres outage leaves it stale, logged, never a dead task."""
    while True:
        try:
            async with pool.acquire(timeout=ACQUIRE_TIMEOUT) as connection:
                metrics.dead_letters_open.set(await count_open(connection))
        except Exception as exc:  # noqa: BLE001 - a stale gauge, never a dead task
            log.warning("dead_letters_gauge_stale", error=describe(exc))
        await asyncio.sleep(every)


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
        return {name: iso_utc(value) if isinstance(value, datetime) else value
                for name, value in asdict(self).items() if value is not None}


async def search_dead_letters(conn, where: DeadLetterFilter, before: int | None = None, limit: int = 50) -> list[dict]:
    """One page, newest first: rows with ids below `before` (None: the newest)."""
    rows = await conn.fetch(SQL["search_dead_letters"], where.source, where.status, where.error_type, where.since,
                            where.until, where.text, before, limit)
    return [_decoded(row) for row in rows]


async def matching_open_ids(conn, where: DeadLetterFilter) -> list[int]:
    """The open dead letters the filter matches (its status aside): the set a bulk action freezes."""
    rows = await conn.fetch(SQL["matching_open_dead_letter_ids"], where.source, where.error_type, where.since,
                            where.until, where.text)
    return [row["id"] for row in rows]


async def filter_choices(conn) -> tuple[list[str], list[str]]:
    """Every source and last error type the table holds."""
    row = await conn.fetchrow(SQL["dead_letter_choices"])
    return list(row["sources"]), list(row["error_types"])


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


async def mark_replayed(conn, ids: Sequence[int], actor: Actor = UNKNOWN_ACTOR,
                        bulk_action_id: int | None = None) -> list[int]:
    """Status `replayed`, and one more entry in each one's replay history."""
    async with conn.transaction():
        marked = [row["id"] for row in await conn.fetch(SQL["set_dead_letter_status"], list(ids), "replayed")]
        await conn.execute(SQL["insert_replay"], marked, str(actor), bulk_action_id)
    return marked


async def discard(conn, ids: Sequence[int], actor: Actor = UNKNOWN_ACTOR) -> list[int]:
    """Marks them discarded (kept for audit); all or nothing: an unknown id
    raises DeadLetterNotFound and changes nothing."""
    async with _connection(conn) as connection, connection.transaction():
        discarded = await connection.fetch(SQL["set_dead_letter_status"], list(ids), "discarded")
        _require_all_found(ids, discarded)
        await record_audit(connection, actor, "discard", [row["id"] for row in discarded])
    return [row["id"] for row in discarded]


async def replay_if_open(conn, channel: AbstractChannel, namespace: str, dead_letter_id: int, actor: Actor,
                         bulk_action_id: int | None = None) -> None:
    """Replay one dead letter only while it is still open: the console's
    button, and each step of a bulk replay. Its row stays locked from the
    check to the commit, so two people clicking at once replay it once; the
    second gets ChangedMeanwhile. A single replay is audited here, a bulk
    one by its caller, once for the whole set."""
    async with conn.transaction():
        row = await _lock_open(conn, dead_letter_id)
        if row["last_error_type"] == UNREADABLE:
            raise NotReplayable([dead_letter_id])
        # Marked before the publish: a new failure of the replayed event
        # waits for this commit, then records a new open row (insert_dead_letter).
        await mark_replayed(conn, [dead_letter_id], actor, bulk_action_id)
        try:
            await topology.publish(channel, to_amqp(rebuilt_event(row)), topology.events_queue(namespace),
                                   timeout=REPLAY_PUBLISH_TIMEOUT)
        except Exception as exc:  # noqa: BLE001 - any broker failure: nothing was replayed
            raise ReplayInterrupted([], exc) from exc
        if bulk_action_id is None:
            await record_audit(conn, actor, "replay", [dead_letter_id])


async def discard_if_open(conn, dead_letter_id: int, actor: Actor, bulk_action_id: int | None = None) -> None:
    """Discard one dead letter only while it is still open (see replay_if_open)."""
    async with conn.transaction():
        await _lock_open(conn, dead_letter_id)
        await conn.execute(SQL["set_dead_letter_status"], [dead_letter_id], "discarded")
        if bulk_action_id is None:
            await record_audit(conn, actor, "discard", [dead_letter_id])


async def _lock_open(conn, dead_letter_id: int):
    row = await conn.fetchrow(SQL["lock_dead_letter"], dead_letter_id)
    if row is None:
        raise DeadLetterNotFound([dead_letter_id])
    if row["status"] != "dead":
        raise ChangedMeanwhile(dead_letter_id, row["status"])
    return row


@contextlib.asynccontextmanager
async def _connection(conn_or_pool) -> AsyncIterator:
    if hasattr(conn_or_pool, "acquire"):  # a pool
        async with conn_or_pool.acquire() as connection:
            yield connection
    else:
        yield conn_or_pool


async def replay(conn, channel: AbstractChannel, namespace: str, ids: Sequence[int] | None = None, all_: bool = False,
                 source: str | None = None, actor: Actor = UNKNOWN_ACTOR) -> list[int]:
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
    try:
        for row in rows:
            async with conn.transaction():  # marked before the publish, committed after its confirm
                marked = await mark_replayed(conn, [row["id"]], actor)
                try:
                    await topology.publish(channel, to_amqp(rebuilt_event(row)), topology.events_queue(namespace),
                                           timeout=REPLAY_PUBLISH_TIMEOUT)
                except Exception as exc:  # noqa: BLE001 - any broker failure: report what was done
                    raise ReplayInterrupted(replayed, exc) from exc
            replayed += marked
    finally:
        if replayed:  # also what a replay that stopped half way did
            await record_audit(conn, actor, "replay", replayed)
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
