"""The admin API's incidents (docs/reference.md §8): the CLI's documents over HTTP.

    GET  /admin/incidents?state=&limit=
    GET  /admin/incidents/{id}
    POST /admin/incidents/{id}/acknowledge
    POST /admin/incidents/{id}/resolve
    POST /admin/incidents/{id}/replay     the incident's open dead letters
    POST /admin/incidents/{id}/discard    the same, discarded

Routes of the admin sub-application: its bearer-token middleware and its
expected failures (ingress/admin/api.py) apply.
"""

from aiohttp import web

from webhook_ingest.ingress.appkeys import database_pool_key, settings_key
from webhook_ingest.ingress.publishing import publisher_key
from webhook_ingest.ingress.responses import error
from webhook_ingest.shared.audit import Actor
from webhook_ingest.shared.dead_letters import ReplayInterrupted, parse_id
from webhook_ingest.shared.incidents import STATES, IncidentNotFound, IncidentStore, event_document, incident_document
from webhook_ingest.shared.observability import get_logger

from .common import dead_letters_key, json_document, parse_path_id, role_key

log = get_logger(__name__)
MAX_LIMIT = 1000


def add_incident_routes(admin: web.Application) -> None:
    admin.router.add_get("/incidents", list_route)
    admin.router.add_get("/incidents/{id}", show_route)
    admin.router.add_post("/incidents/{id}/acknowledge", change_route("acknowledged"))
    admin.router.add_post("/incidents/{id}/resolve", change_route("resolved"))
    admin.router.add_post("/incidents/{id}/replay", replay_route)
    admin.router.add_post("/incidents/{id}/discard", discard_route)


async def list_route(request: web.Request) -> web.Response:
    state = request.query.get("state") or None
    limit = request.query.get("limit")
    if state not in (None, *STATES):
        return error(400, "invalid_state")
    if limit is not None and (parse_id(limit) is None or int(limit) > MAX_LIMIT):
        return error(400, "invalid_limit")
    rows = await _store(request).newest_first(state, int(limit) if limit else 100)
    return json_document(200, [incident_document(row) for row in rows])


async def show_route(request: web.Request) -> web.Response:
    incident_id = parse_path_id(request)
    store = _store(request)
    try:
        document = incident_document(await store.get(incident_id))
    except IncidentNotFound:
        return error(404, "not_found")
    history = [
        {"state": h["state"], "actor": h["actor"], "at": h["at"].isoformat()} for h in await store.history(incident_id)
    ]
    events = [event_document(row) for row in await store.events(incident_id)]
    return json_document(200, {**document, "history": history, "events": events})


def change_route(state: str):
    async def route(request: web.Request) -> web.Response:
        incident_id = parse_path_id(request)
        store = _store(request)
        try:
            changed = await store.change(incident_id, state, str(_actor(request)))
        except IncidentNotFound:
            return error(404, "not_found")
        if not changed:
            return error(409, "changed_meanwhile" if state == "acknowledged" else "already_resolved")
        return json_document(200, incident_document(await store.get(incident_id)))

    return route


async def replay_route(request: web.Request) -> web.Response:
    ids = await _open_dead_letters(request)
    if ids is None:
        return error(404, "not_found")
    publisher = request.config_dict[publisher_key]
    if not publisher.ready or publisher.channel is None:
        return error(503, "broker_unavailable", {"Retry-After": "5"})
    try:
        done = await request.config_dict[dead_letters_key].replay(
            publisher.channel, request.config_dict[settings_key].namespace, ids=ids, actor=_actor(request)
        )
    except ReplayInterrupted as exc:
        log.warning("incident_replay_failed", error=str(exc))
        return error(503, "broker_unavailable", {"Retry-After": "5"})
    return json_document(200, {"replayed": done.replayed, "skipped": done.skipped})


async def discard_route(request: web.Request) -> web.Response:
    ids = await _open_dead_letters(request)
    if ids is None:
        return error(404, "not_found")
    discarded = await request.config_dict[dead_letters_key].discard(ids, _actor(request)) if ids else []
    return json_document(200, {"discarded": discarded})


async def _open_dead_letters(request: web.Request) -> list[int] | None:
    incident_id = parse_path_id(request)
    store = _store(request)
    try:
        await store.get(incident_id)
    except IncidentNotFound:
        return None
    return await store.open_dead_letter_ids(incident_id)


def _store(request: web.Request) -> IncidentStore:
    return IncidentStore(request.config_dict[database_pool_key])


def _actor(request: web.Request) -> Actor:
    return Actor(request[role_key], "admin-api")
