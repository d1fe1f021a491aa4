"""The console's incidents (docs/oncall.md, "Incidents"): failures grouped
by source, handler and error. The overview lists the unresolved ones first;
an incident's page shows its error, its history and its events, and offers
acknowledge, resolve, and the replay or discard of its open dead letters —
a bulk action over the set frozen when asked, confirmed, paced and audited
like "all matching" on the dead-letters page."""

from aiohttp import web

from webhook_ingest.ingress.admin import dead_letters_key
from webhook_ingest.ingress.appkeys import database_pool_key
from webhook_ingest.shared.audit import Actor
from webhook_ingest.shared.dead_letters import bulk as bulk_actions
from webhook_ingest.shared.dead_letters import parse_id
from webhook_ingest.shared.incidents import IncidentNotFound, IncidentStore

from .rendering import leave_message, message_page, render
from .security import role_key

routes = web.RouteTableDef()
LISTED = 100


def add_incident_routes(console: web.Application) -> None:
    console.router.add_routes(routes)


def incidents(request: web.Request) -> IncidentStore:
    return IncidentStore(request.config_dict[database_pool_key])


@routes.get("/incidents")
async def incidents_page(request: web.Request) -> web.Response:
    rows = await incidents(request).newest_first(None, LISTED)
    return await render(request, "incidents.html", {"incidents": rows})


@routes.get("/incidents/{id}")
async def incident_page(request: web.Request) -> web.Response:
    incident_id = _id_or_404(request)
    store = incidents(request)
    try:
        incident = await store.get(incident_id)
    except IncidentNotFound:
        return await message_page(request, 404, "No such incident", f"There is no incident {incident_id}.")
    context = {
        "incident": incident,
        "history": await store.history(incident_id),
        "events": await store.events(incident_id),
        "open_dead_letters": await store.open_dead_letter_ids(incident_id),
    }
    return await render(request, "incident.html", context)


@routes.post("/incidents/{id}/acknowledge")
async def acknowledge(request: web.Request) -> web.Response:
    return await _change(request, "acknowledged", "Acknowledged: on-call is on it.", "It was not open: nothing done.")


@routes.post("/incidents/{id}/resolve")
async def resolve(request: web.Request) -> web.Response:
    return await _change(request, "resolved", "Resolved. A new failure will reopen it.", "It was resolved already.")


@routes.post("/incidents/{id}/bulk")
async def prepare_bulk(request: web.Request) -> web.Response:
    """Freeze the incident's open dead letters now; the bulk page asks to confirm."""
    incident_id = _id_or_404(request)
    action = (await request.post()).get("action")
    if action not in bulk_actions.ACTIONS:
        return await message_page(request, 400, "Nothing was done", "Unknown action.")
    ids = await incidents(request).open_dead_letter_ids(incident_id)
    if not ids:
        await leave_message(request, "error", "This incident has no open dead letters: nothing to do.")
        raise web.HTTPSeeOther(f"/console/incidents/{incident_id}")
    bulk_action_id = await request.config_dict[dead_letters_key].prepare_bulk(
        str(action), ids, {"incident": incident_id}, _actor(request)
    )
    raise web.HTTPSeeOther(f"/console/bulk/{bulk_action_id}")


async def _change(request: web.Request, state: str, done: str, not_done: str) -> web.Response:
    incident_id = _id_or_404(request)
    try:
        changed = await incidents(request).change(incident_id, state, str(_actor(request)))
    except IncidentNotFound:
        raise web.HTTPNotFound() from None
    await leave_message(request, "ok" if changed else "error", done if changed else not_done)
    raise web.HTTPSeeOther(f"/console/incidents/{incident_id}")


def _id_or_404(request: web.Request) -> int:
    incident_id = parse_id(request.match_info["id"])
    if incident_id is None:
        raise web.HTTPNotFound()
    return incident_id


def _actor(request: web.Request) -> Actor:
    return Actor(request[role_key], "console")
