"""The console's event archive (docs/reference.md §8.1): the Events page
searches it as the admin API does (the same filter, store and statements:
shared/archive/search.py, shared/archive/store.py), newest first, a page
at a time; an event's page shows every arrival of its key — the event, its
copies, its conflicts — with its body and headers, what became of it, its
attempts' errors and replays (from its dead letters) and links to them.

A filter with a problem is a message on the page (400), never a search nor
a 500; bodies and headers are shown as text, escaped, whatever they hold.
"""

import asyncio
import json
from dataclasses import dataclass
from urllib.parse import quote

import asyncpg
from aiohttp import web

from webhook_ingest.ingress import signature_headers
from webhook_ingest.ingress.admin import dead_letters_key
from webhook_ingest.ingress.appkeys import database_pool_key, sources_key
from webhook_ingest.ingress.tokens import may_change
from webhook_ingest.shared.archive import (
    COUNT_CAP,
    STATUSES,
    ArchiveStore,
    Cursor,
    SourceRoutes,
    completion,
    route_completions,
    route_names,
)
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.dead_letters import DeadLetterStore
from webhook_ingest.shared.replays import EventReplayStore

from .event_search import LABELS, EventSearch, event_search
from .rendering import message_page, render
from .security import role_key

PAGE_SIZE = 50
SHOWN_DEAD_LETTERS = 10  # an event's latest dead letters whose attempts and replays its page lists
SHOWN_ARRIVALS = 100  # of a key's arrivals (a provider retrying for days), each with its body and headers
SHOWN_COPY_TIMES = 20
SHOWN_BODY_CHARS = 512 * 1024  # of one body on a page; the CLI and the admin API give it whole
routes = web.RouteTableDef()


def add_event_routes(console: web.Application) -> None:
    console.router.add_routes(routes)


def archive_store(request: web.Request) -> ArchiveStore:
    return ArchiveStore(request.config_dict[database_pool_key])


def event_path(key: str) -> str:
    """An event's page: its key whole in one path segment (an event id may hold '/', '?', '#')."""
    return "/console/events/" + quote(key, safe=":@")


# -- the search ------------------------------------------------------------------


@routes.get("/events")
async def events_page(request: web.Request) -> web.Response:
    search = event_search(request.query)
    rows, count, copies = (
        await _results(archive_store(request), search, SourceRoutes.of(request.config_dict[sources_key]))
        if not search.problems
        else ([], None, {})
    )
    context = {
        "search": search,
        "values": search.values,
        "labels": LABELS,
        "statuses": STATUSES,
        "problems": search.problems + ([search.cursor_problem] if search.cursor_problem else []),
        "rows": [_row_view(row, copies) for row in rows[:PAGE_SIZE]],
        "count_text": _count_text(count),
        "next": _next_query(search, rows),
        "newest": search.query() if search.after else None,
    }
    return await render(request, "events.html", context, status=400 if search.problems else 200)


async def _results(
    store: ArchiveStore, search: EventSearch, routes: SourceRoutes
) -> tuple[list[asyncpg.Record], int, dict]:
    """One row more than a page (is there a next one?), the capped count, the page's copies."""
    rows, count = await asyncio.gather(
        store.search(search.where, search.after, PAGE_SIZE + 1, routes), store.count(search.where, COUNT_CAP, routes)
    )
    copies = await store.copies(sorted({row["key"] for row in rows[:PAGE_SIZE]})) if rows else {}
    return rows, count, copies


def _row_view(row: asyncpg.Record, copies: dict[str, tuple[int, int]]) -> dict:
    copied, conflicts = copies.get(row["key"], (0, 0))
    return dict(row) | {"path": event_path(row["key"]), "copies": copied, "conflicts": conflicts}


def _count_text(count: int | None) -> str | None:
    if count is None:
        return None
    return f"{COUNT_CAP:,}+" if count >= COUNT_CAP else f"{count:,}"


def _next_query(search: EventSearch, rows: list[asyncpg.Record]) -> str | None:
    if len(rows) <= PAGE_SIZE:
        return None
    last = rows[PAGE_SIZE - 1]
    return search.query(cursor=Cursor.below(last).encode())


# -- one event -------------------------------------------------------------------


@dataclass(frozen=True)
class Body:
    kind: str  # json (pretty-printed), text (as received), bytes (not UTF-8: escapes), missing (not written yet)
    text: str
    clipped: bool = False


def body_view(body: bytes | None) -> Body:
    if body is None:
        return Body("missing", "")
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        pass
    else:
        return _clipped("json", json_text(value))
    try:
        return _clipped("text", body.decode("utf-8"))
    except UnicodeDecodeError:
        return _clipped("bytes", body.decode("utf-8", errors="backslashreplace"))


def json_text(value) -> str:
    """Pretty JSON; an escaped unpaired surrogate stays escaped (it cannot be UTF-8)."""
    text = json.dumps(value, indent=2, ensure_ascii=False)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # an escaped unpaired surrogate in the body: keep it escaped
        return json.dumps(value, indent=2)
    return text


def _clipped(kind: str, text: str) -> Body:
    return Body(kind, text[:SHOWN_BODY_CHARS], len(text) > SHOWN_BODY_CHARS)


def headers_view(headers_json: str | None, hidden: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """Name and value, in the order stored; a value that is not a string as JSON; `hidden` names' values hidden."""
    headers = signature_headers.hide(json.loads(headers_json) if headers_json else {}, hidden)
    if not isinstance(headers, dict):
        return [("", json.dumps(headers))]
    return [(name, value if isinstance(value, str) else json.dumps(value)) for name, value in headers.items()]


def arrival_view(row: asyncpg.Record, hidden: frozenset[str] = frozenset()) -> dict:
    return dict(row) | {
        "body_view": body_view(bytes(row["body"]) if row["body"] is not None else None),
        "header_list": headers_view(row["headers"], hidden),
    }


@routes.get("/events/{key:.+}")
async def event_page(request: web.Request) -> web.Response:
    if signature_headers.asked(request) and not may_change(request.get(role_key)):
        return await message_page(
            request,
            403,
            "Signature headers are the operator's",
            "With its body, a signature header is the request itself: the viewer token sees every other header.",
        )
    key = request.match_info["key"]
    sources = request.config_dict[sources_key]
    hidden = signature_headers.hidden_names(request)
    routes = route_names(sources, key)
    arrivals, records = await archive_store(request).event_rows(key, routes) if _searchable(key) else ([], None)
    if not arrivals or records is None:
        return await message_page(
            request,
            404,
            "No such archived event",
            f"No arrival of the key “{_shown(key)}” is in the archive: it was never "
            "accepted, its source is not archived (retention 0d), or its days are past "
            "the source's retention.",
        )
    runs = [row for row in arrivals if row["status"] not in (archive.DUPLICATE, archive.CONFLICT)] or arrivals[:1]
    dead_letters = json.loads(records["dead_letters"])
    selection_replays = EventReplayStore(request.config_dict[database_pool_key])
    context = {
        "key": key,
        "event": arrival_view(runs[0], hidden),
        "runs": runs,
        "arrivals": [arrival_view(row, hidden) for row in arrivals[:SHOWN_ARRIVALS]],
        "arrivals_total": len(arrivals),
        "copies": [row["received_at"] for row in arrivals if row["status"] == archive.DUPLICATE],
        "conflicts": sum(row["status"] == archive.CONFLICT for row in arrivals),
        "completion": completion(records),
        "completions": route_completions(records),
        "dead_letters": await _dead_letters(request.config_dict[dead_letters_key], dead_letters),
        "selection_replays": await selection_replays.replays_of(key, routes),
    }
    return await render(
        request, "event.html", context | {"shown_copy_times": SHOWN_COPY_TIMES, "signatures_shown": not hidden}
    )


async def _dead_letters(store: DeadLetterStore, listed: list[dict]) -> list[dict]:
    """The key's latest dead letters, each with its attempts' errors and its replays."""
    shown = []
    for dead_letter in listed[-SHOWN_DEAD_LETTERS:]:
        row = await store.get(dead_letter["id"])
        errors = row["errors"] if row is not None else []
        shown.append(dead_letter | {"errors": errors, "replays": await store.replays_of(dead_letter["id"])})
    return shown


def _searchable(key: str) -> bool:
    return "\x00" not in key and key.encode("utf-8", errors="replace").decode() == key


def _shown(key: str) -> str:
    text = key.encode("utf-8", errors="backslashreplace").decode().replace("\x00", "\\x00")
    return text if len(text) <= 200 else text[:200] + "…"
