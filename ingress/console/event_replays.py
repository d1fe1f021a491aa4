"""The console's replay of archived events by selection (docs/reference.md
§8.1, §8 "Replaying archived events"): from the Events page's search, the
selection is frozen and counted, the operator confirms with a rate, then
watches its progress and may cancel — the dead letters' bulk action's steps,
on the store and runner the admin API uses (`shared/replays/store.py`,
`ingress/admin/event_replays.py`).

    POST /console/event-replays              the search's filter: freeze, then its page
    GET  /console/event-replays/{id}         count, confirm, progress (htmx: the progress alone)
    POST /console/event-replays/{id}/start   {rate}: run it in this process (also a resume)
    POST /console/event-replays/{id}/cancel
"""

from aiohttp import web

from webhook_ingest.ingress.admin import parse_rate, start
from webhook_ingest.ingress.appkeys import database_pool_key, sources_key
from webhook_ingest.shared.archive import SourceRoutes
from webhook_ingest.shared.dead_letters import parse_id
from webhook_ingest.shared.replays import EventReplayStore
from webhook_ingest.shared.runs import DEFAULT_RATE, MAX_RATE, MIN_RATE, RunBusy

from .event_search import event_search
from .rendering import leave_message, message_page, render
from .views import actor

routes = web.RouteTableDef()
LABELS = {
    "source": "source",
    "status": "status",
    "type": "type",
    "since": "from",
    "until": "until",
    "key": "key prefix",
    "event_id": "event id prefix",
    "payload": "payload contains",
}


def add_event_replay_routes(console: web.Application) -> None:
    console.router.add_routes(routes)


def _store(request: web.Request) -> EventReplayStore:
    return EventReplayStore(request.config_dict[database_pool_key])


@routes.post("/event-replays")
async def prepare(request: web.Request) -> web.Response:
    """Freeze what the search's filter matches now; the replay's page asks to confirm."""
    form = {name: value for name, value in (await request.post()).items() if isinstance(value, str)}
    search = event_search(form)
    if search.problems:
        return await message_page(request, 400, "Nothing was replayed", " ".join(search.problems))
    replay = await _store(request).prepare(
        search.where, actor(request), SourceRoutes.of(request.config_dict[sources_key])
    )
    if replay.total == 0:
        await _store(request).cancel(replay.id)
        await leave_message(request, "error", "No archived event this search matches can be replayed: nothing to do.")
        raise web.HTTPSeeOther("/console/events?" + search.query())
    raise web.HTTPSeeOther(f"/console/event-replays/{replay.id}")


@routes.get("/event-replays/{id}")
async def replay_page(request: web.Request) -> web.Response:
    replay_id = _id(request)
    replay = await _store(request).get(replay_id)
    if replay is None:
        return await message_page(request, 404, "No such replay", f"There is no replay {replay_id}.")
    template = "event_replay_progress.html" if request.headers.get("HX-Request") else "event_replay.html"
    return await render(
        request,
        template,
        {
            "replay": replay,
            "default_rate": DEFAULT_RATE,
            "max_rate": MAX_RATE,
            "filter_text": describe_filter(replay.filter),
        },
    )


def describe_filter(saved: dict) -> str:
    parts = [f"{label} {saved[name]!r}" for name, label in LABELS.items() if saved.get(name)]
    return ", ".join(parts) or "no filter: every archived event"


@routes.post("/event-replays/{id}/start")
async def start_replay(request: web.Request) -> web.Response:
    replay_id = _id(request)
    rate = parse_rate((await request.post()).get("rate"))
    if rate is None:
        await leave_message(
            request, "error", f"The rate must be a number from {MIN_RATE:g} to {MAX_RATE:g} per second."
        )
        raise web.HTTPSeeOther(f"/console/event-replays/{replay_id}")
    replay = await _store(request).claim(replay_id, rate)
    if replay is None:
        await leave_message(request, "error", "This replay is not waiting to start: nothing was changed.")
    else:
        start(request, replay, _store(request), actor(request))
    raise web.HTTPSeeOther(f"/console/event-replays/{replay_id}")


@routes.post("/event-replays/{id}/cancel")
async def cancel_replay(request: web.Request) -> web.Response:
    replay_id = _id(request)
    try:
        cancelled = await _store(request).cancel(replay_id, actor(request))
    except RunBusy as busy:
        await leave_message(request, "error", str(busy))
        raise web.HTTPSeeOther(f"/console/event-replays/{replay_id}") from None
    await leave_message(
        request,
        "ok" if cancelled else "error",
        "Cancelled: what was published stays published." if cancelled else "This replay had already ended.",
    )
    raise web.HTTPSeeOther(f"/console/event-replays/{replay_id}")


def _id(request: web.Request) -> int:
    replay_id = parse_id(request.match_info["id"])
    if replay_id is None:
        raise web.HTTPNotFound()
    return replay_id
