"""Searching the event archive: the filter the admin API and `webhook-ingest
events` share, and the JSON documents both answer with (docs/reference.md
§2, §8), defined once so the two cannot drift apart.

A search is one page, newest first, with keyset pagination: the page's last
row (received_at, source, key, arrival) is the `next` cursor, so a page costs the
same however deep it is and rows arriving meanwhile do not shift it. The
count of matches stops at COUNT_CAP.
"""

import base64
import json
from collections.abc import Callable, Mapping
from dataclasses import astuple, dataclass
from datetime import UTC, datetime
from typing import NoReturn, TypeVar

import asyncpg
import orjson

from webhook_ingest.shared import storable_json
from webhook_ingest.shared.db import iso_utc
from webhook_ingest.shared.errors import WebhookIngestError
from webhook_ingest.shared.sources import Source

from . import model as archive

STATUSES = (
    archive.QUEUED,
    "processing",
    archive.RETRYING,
    archive.PROCESSED,
    archive.STALE,
    archive.DEAD,
    archive.DISCARDED,
    archive.CONFLICT,
    archive.DUPLICATE,
    archive.IGNORED,
)
DEFAULT_LIMIT, MAX_LIMIT = 50, 1000
COUNT_CAP = 10_000
_Parsed = TypeVar("_Parsed")  # what a parser of a filter's field gives


class InvalidFilter(WebhookIngestError):
    """A search filter that cannot be one."""

    def __init__(self, field: str, problem: str):
        self.field = field
        super().__init__(f"{field}: {problem}")


@dataclass(frozen=True)
class EventFilter:
    """None is "any". `key` and `event_id` are prefixes; `payload` a JSON
    object the body must contain (`{"customer": "cus_123"}`)."""

    source: str | None = None
    status: str | None = None
    event_type: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    key: str | None = None
    event_id: str | None = None
    payload: str | None = None  # JSON text, checked to be an object

    def arguments(self) -> tuple:
        """search_archive's $1-$8."""
        return astuple(self)


@dataclass(frozen=True)
class SourceRoutes:
    """Every route of the sources file, as (source, route name) pairs: a
    routed event's arrival is `processing` while one of its routes holds its
    lease, on KEY#ROUTE (docs/design.md, "Routes"), where a source with one
    handler's holds it on KEY. None known (`NO_ROUTES`): leases on KEY alone
    are read, and a routed event stays `queued` while its routes run."""

    sources: tuple[str, ...] = ()
    names: tuple[str, ...] = ()

    @classmethod
    def of(cls, sources: dict[str, Source]) -> "SourceRoutes":
        pairs = [(name, route.name) for name, source in sources.items() for route in source.routes]
        return cls(tuple(name for name, _ in pairs), tuple(route for _, route in pairs))

    def arguments(self) -> tuple[list[str], list[str]]:
        """The search statements' last two: the sources, their route names."""
        return list(self.sources), list(self.names)


NO_ROUTES = SourceRoutes()


@dataclass(frozen=True)
class Cursor:
    """The last row of a page: the next page starts below it."""

    received_at: datetime
    source: str
    key: str
    arrival: int = 0  # two arrivals of a key may share their millisecond

    @classmethod
    def below(cls, row: asyncpg.Record) -> "Cursor":
        """The cursor of the page below `row`, a search's last."""
        return cls(row["received_at"], row["source"], row["key"], row["arrival"])

    def encode(self) -> str:
        raw = orjson.dumps([self.received_at.isoformat(), self.source, self.key, self.arrival])
        return base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @classmethod
    def decode(cls, text: str) -> "Cursor":
        try:
            received_at, source, key, *arrival = json.loads(base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
            if len(arrival) > 1 or not all(type(value) is int and 0 <= value < 2**63 for value in arrival):
                raise ValueError("not a cursor")  # a bigint, or none: a cursor from before arrivals had ids
            return cls(datetime.fromisoformat(received_at), str(source), str(key), *arrival)
        except (ValueError, TypeError, RecursionError) as exc:  # RecursionError: '[' nested past the stack
            raise InvalidFilter("cursor", "not a cursor this API gave") from exc


def parse_filter(query: Mapping[str, str]) -> EventFilter:
    """The filter from the API's query string (the CLI's options by the same
    names); the first field that cannot be one raises InvalidFilter."""
    where, problems = filter_and_problems(query)
    if problems:
        raise problems[0]
    return where


def filter_and_problems(query: Mapping[str, str]) -> tuple[EventFilter, list[InvalidFilter]]:
    """The filter, and every field that cannot be one (left out of the
    filter): the console's search form says what is wrong with each. A
    value Postgres could not take (a NUL, an unpaired surrogate, a NaN in
    the payload) is a problem here, not a failed query."""
    problems: list[InvalidFilter] = []

    def checked(parse: Callable[..., _Parsed], *arguments: str | None) -> _Parsed | None:
        try:
            return parse(*arguments)
        except InvalidFilter as exc:
            problems.append(exc)
            return None

    status = checked(parse_status, _text(query, "status"))
    where = EventFilter(
        source=checked(parse_text, "source", _text(query, "source")),
        status=status,
        event_type=checked(parse_text, "type", _text(query, "type")),
        since=checked(parse_time, "since", _text(query, "since")),
        until=checked(parse_time, "until", _text(query, "until")),
        key=checked(parse_text, "key", _text(query, "key")),
        event_id=checked(parse_text, "event_id", _text(query, "event_id")),
        payload=checked(parse_payload, _text(query, "payload")),
    )
    return where, sorted(problems, key=lambda problem: FIELDS.index(problem.field))


FIELDS = ("status", "since", "until", "payload", "source", "type", "key", "event_id")  # the order problems are told


def _text(query: Mapping[str, str], name: str) -> str | None:
    value = query.get(name)
    return value if isinstance(value, str) and value else None


def parse_status(text: str | None) -> str | None:
    if text is not None and text not in STATUSES:
        raise InvalidFilter("status", f"one of {', '.join(STATUSES)}")
    return text


def parse_text(field: str, text: str | None) -> str | None:
    if text is not None and not _storable(text):
        raise InvalidFilter(field, "a NUL or an unpaired surrogate cannot be searched for")
    return text


def parse_time(field: str, text: str | None) -> datetime | None:
    """ISO 8601; without an offset, UTC."""
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise InvalidFilter(field, "an ISO 8601 time such as 2026-11-25T14:00:00Z") from exc
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def parse_payload(text: str | None) -> str | None:
    if not text:
        return None
    try:  # as the ingress parses a body: what jsonb cannot hold (1e999999, NaN, \u0000) is no search either
        value = storable_json.parse(text.encode())
    except ValueError as exc:  # UnicodeEncodeError (a lone surrogate) and NotStorable included
        if _holds_unstorable_text(text):
            raise InvalidFilter("payload", "a NUL or an unpaired surrogate cannot be searched for") from exc
        raise InvalidFilter(
            "payload", 'a JSON object such as {"customer": "cus_123"}, whose numbers and text Postgres can hold'
        ) from exc
    if not isinstance(value, dict):
        raise InvalidFilter("payload", 'a JSON object such as {"customer": "cus_123"}')
    if not all(_storable(string) for string in _strings(value)) or not _storable(text):
        raise InvalidFilter("payload", "a NUL or an unpaired surrogate cannot be searched for")
    if not _names_a_value(value):
        raise InvalidFilter(
            "payload",
            "at least one value to look for (a string, number, true, false or null), such"
            ' as {"customer": "cus_123"}: empty objects and lists alone would read'
            " every archived body",
        )
    return text


def _holds_unstorable_text(text: str) -> bool:
    """Whether the refused filter is JSON whose text holds a NUL or an
    unpaired surrogate (said as such), rather than JSON no store can hold."""
    if not _storable(text):
        return True
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return False
    return isinstance(value, dict) and not all(_storable(string) for string in _strings(value))


def _names_a_value(value: dict) -> bool:
    """Whether the filter holds a scalar anywhere. The payload index
    (jsonb_path_ops, migration 0016) keeps a hash of each path to a value;
    a filter with none gives it nothing to look up, and Postgres then
    checks every archived body (0.74 s at 60,000 rows, against 11 ms)."""
    pending: list = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        else:
            return True
    return False


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON that Postgres stores")


def _storable(text: str) -> bool:
    """Text Postgres takes: UTF-8 without NUL."""
    return "\x00" not in text and text.encode("utf-8", errors="replace").decode() == text


def _strings(value: object) -> list[str]:
    """Every key and string in a parsed JSON value (without recursion: it may be deep)."""
    found, pending = [], [value]
    while pending:
        item = pending.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict):
            found.extend(item)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return found


def parse_limit(text: str | None) -> int:
    if not text:
        return DEFAULT_LIMIT
    if not (text.isascii() and text.isdigit()) or len(text) > 6 or not 1 <= int(text) <= MAX_LIMIT:
        raise InvalidFilter("limit", f"a whole number from 1 to {MAX_LIMIT}")
    return int(text)


# -- documents -------------------------------------------------------------------


def summary(row: asyncpg.Record) -> dict:
    """One line of `events list --json` / `GET /admin/events`."""
    return {
        "source": row["source"],
        "key": row["key"],
        "event_id": row["event_id"],
        "event_type": row["event_type"],
        "received_at": iso_utc(row["received_at"]),
        "status": row["status"],
        "attempts": row["attempts"],
        "last_error": row["last_error"],
        "completed_at": iso_utc(row["completed_at"]) if row["completed_at"] else None,
        "replay_of": row["replay_of"] or None,
        **({"ignore_rule": row["ignore_rule"]} if row["ignore_rule"] else {}),
    }


def page(rows: list, count: int | None, limit: int) -> dict:
    """One page: `events list --json` / `GET /admin/events`. `count` (the
    first page's; None on the next ones) stops at COUNT_CAP; `next` is the
    cursor of the page below, None on the last."""
    last = rows[-1] if len(rows) == limit else None
    return {
        "events": [summary(row) for row in rows],
        "count": count,
        "count_capped": count is not None and count >= COUNT_CAP,
        "next": Cursor.below(last).encode() if last else None,
    }


def arrival(row: asyncpg.Record) -> dict:
    """One arrival on an event's page: its summary, what it carried."""
    document = summary(row) | {
        "payload_sha256": row["payload_sha256"],
        "headers": json.loads(row["headers"]) if row["headers"] else None,
    }
    body = bytes(row["body"]) if row["body"] is not None else None
    try:  # json, not orjson: integers wider than 64 bits stay exact
        document["payload"] = json.loads(body) if body is not None else None
    except ValueError:  # a form, or not text: the raw body instead
        document["payload"] = None
        document["body"] = body.decode(errors="replace") if body is not None else None
    return document


def exported(row: asyncpg.Record) -> dict:
    """One line of `events export`: the summary, the headers and the body.
    `payload` is the body parsed when it is JSON; otherwise (a form, bytes
    that are not UTF-8) `body_base64` holds the raw bytes, exactly. Both are
    null while the body is not archived yet."""
    document = summary(row) | {
        "payload_sha256": row["payload_sha256"],
        "headers": json.loads(row["headers"]) if row["headers"] else None,
        "payload": None,
        "body_base64": None,
    }
    body = bytes(row["body"]) if row["body"] is not None else None
    if body is not None:
        try:  # json, not orjson: integers wider than 64 bits stay exact
            document["payload"] = json.loads(body, parse_constant=_refuse_constant)
        except (ValueError, RecursionError):  # NaN is not JSON another system reads
            document["body_base64"] = base64.b64encode(body).decode()
    return document


def event(key: str, arrivals: list[asyncpg.Record], records: asyncpg.Record) -> dict:
    """`events show KEY --json` / `GET /admin/events/{key}`: every arrival of
    the key, and what the pipeline recorded of it (its completion, each
    route's, its dead letters)."""
    return {
        "key": key,
        "source": key.split(":", 1)[0],
        "event_id": key.split(":", 1)[1] if ":" in key else key,
        "arrivals": [arrival(row) for row in arrivals],
        "completion": completion(records),
        "completions": route_completions(records),
        "dead_letters": json.loads(records["dead_letters"]),
    }


def completion(records: asyncpg.Record) -> dict | None:
    """The completion under the event's own key: a source with one handler's
    (a routed source runs nothing under it)."""
    return json.loads(records["completion"]) if records["completion"] else None


def route_completions(records: asyncpg.Record) -> dict[str, dict | None]:
    """Each route of the event's source, in the sources file's order, with
    the completion of its run (KEY#ROUTE) or None; {} for a source without
    routes."""
    return {route: done for route, done in json.loads(records["route_completions"])}


def route_names(sources: Mapping[str, Source], key: str) -> list[str]:
    """The names of the routes of `key`'s source (SOURCE:EVENT_ID), in the
    file's order: none for a source with one handler, or one the file does
    not name."""
    source = sources.get(key.split(":", 1)[0])
    return [route.name for route in source.routes] if source is not None else []
