"""The admin API's event archive (docs/reference.md §8): search it, read an event.

    GET /admin/events?source=&status=&type=&since=&until=&key=&event_id=&payload=&limit=&cursor=
    GET /admin/events/{key}[?signatures=show]

Routes of the admin sub-application: its bearer-token middleware and its
expected failures (ingress/admin/api.py) apply; the viewer token may use both.
The documents are the CLI's (`shared/archive/search.py`), signature headers
hidden unless the operator token asks (ingress/signature_headers.py).
"""

from aiohttp import web

from webhook_ingest.ingress import signature_headers
from webhook_ingest.ingress.appkeys import database_pool_key, sources_key
from webhook_ingest.ingress.responses import error
from webhook_ingest.ingress.tokens import may_change
from webhook_ingest.shared.archive import (
    ArchiveStore,
    Cursor,
    InvalidFilter,
    SourceRoutes,
    page,
    parse_filter,
    parse_limit,
    parse_text,
    route_names,
)

from .common import json_document, role_key


def add_event_routes(admin: web.Application) -> None:
    admin.router.add_get("/events", list_route)
    admin.router.add_get("/events/{key:.+}", show_route)  # an event id may hold a slash


async def list_route(request: web.Request) -> web.Response:
    """One page, newest first: {"events", "count" (up to COUNT_CAP), "count_capped", "next"}."""
    try:
        where = parse_filter(request.query)
        limit = parse_limit(request.query.get("limit"))
        after = Cursor.decode(request.query["cursor"]) if request.query.get("cursor") else None
    except InvalidFilter as exc:
        return error(400, f"invalid_{exc.field}")
    store, routes = _store(request), SourceRoutes.of(request.config_dict[sources_key])
    rows = await store.search(where, after, limit, routes)
    count = await store.count(where, routes=routes) if after is None else None  # the first page says how many
    return json_document(200, page(rows, count, limit))


async def show_route(request: web.Request) -> web.Response:
    if signature_headers.asked(request) and not may_change(request[role_key]):
        return error(403, "forbidden")
    key, sources = request.match_info["key"], request.config_dict[sources_key]
    try:
        parse_text("key", key)  # a NUL: no key holds one, and Postgres would refuse the query (not an outage)
    except InvalidFilter:
        return error(400, "invalid_key")
    document = await _store(request).event(key, route_names(sources, key))
    if document is None:
        return error(404, "not_found")
    hidden = signature_headers.hidden_names(request)
    for arrival in document["arrivals"]:
        arrival["headers"] = signature_headers.hide(arrival["headers"], hidden)
    return json_document(200, document)


def _store(request: web.Request) -> ArchiveStore:
    return ArchiveStore(request.config_dict[database_pool_key])
