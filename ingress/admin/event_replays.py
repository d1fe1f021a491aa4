"""The admin API's replays of archived events (docs/reference.md §8,
"Replaying archived events"):

    POST /admin/events/replay             {filter..., "dry_run": true} -> {"count"}
    POST /admin/events/replay             {filter..., "rate": 10}      -> 202, the replay, running
    GET  /admin/events/replay/{id}        its progress
    POST /admin/events/replay/{id}/cancel
    POST /admin/events/replay/{id}/resume {"rate": 10}

The filter is `GET /admin/events`'s, by the same names, in a JSON object
(`payload` an object or its JSON text). A replay is frozen when asked and
run by this ingress process in the background, paced (`shared/runs/paced.py`);
any process shows its progress and may cancel it. Routes of the admin
sub-application: its bearer-token middleware applies, so a viewer's POST is 403.
"""

import json

from aiohttp import web

from webhook_ingest.ingress.appkeys import database_pool_key, settings_key, sources_key
from webhook_ingest.ingress.publishing import publisher_key
from webhook_ingest.ingress.responses import error
from webhook_ingest.shared.archive import InvalidFilter, SourceRoutes, parse_filter
from webhook_ingest.shared.audit import Actor
from webhook_ingest.shared.replays import EventReplay, EventReplayJob, EventReplayStore
from webhook_ingest.shared.runs import DEFAULT_RATE, MAX_RATE, MIN_RATE, PacedRunner, RunBusy

from .common import json_document, parse_path_id, role_key

event_replay_runner_key = web.AppKey("event_replay_runner", PacedRunner)
_FILTER_NAMES = ("source", "status", "type", "since", "until", "key", "event_id", "payload")
_OTHER_NAMES = ("rate", "dry_run")


def setup_event_replays(app: web.Application) -> None:
    """The runner of this process's replays (the admin API's and the console's), stopped with it."""
    app[event_replay_runner_key] = PacedRunner()
    app.on_shutdown.append(app[event_replay_runner_key].stop)


def add_event_replay_routes(admin: web.Application) -> None:
    """Before `/events/{key}`: `replay/7` is no key (a key holds a `:`)."""
    admin.router.add_post("/events/replay", replay_route)
    admin.router.add_get("/events/replay/{id}", show_route)
    admin.router.add_post("/events/replay/{id}/cancel", cancel_route)
    admin.router.add_post("/events/replay/{id}/resume", resume_route)


async def replay_route(request: web.Request) -> web.Response:
    try:
        asked = await request.json()
    except ValueError:
        return error(400, "invalid_json")
    if not isinstance(asked, dict):
        return error(400, "invalid_json")
    try:
        where = parse_filter(_filter_query(asked))
    except InvalidFilter as exc:
        return error(400, f"invalid_{exc.field}")
    rate = parse_rate(asked.get("rate", DEFAULT_RATE))
    dry_run = asked.get("dry_run", False)
    if rate is None or not isinstance(dry_run, bool):
        return error(400, "invalid_rate" if rate is None else "invalid_dry_run")
    store, routes = _store(request), SourceRoutes.of(request.config_dict[sources_key])
    if dry_run:
        return json_document(200, {"dry_run": True, "count": await store.count(where, routes)})
    if not _publisher_ready(request):
        return error(503, "broker_unavailable", {"Retry-After": "5"})
    replay = await store.prepare(where, _actor(request), routes)
    return await _start(request, replay.id, rate)


async def show_route(request: web.Request) -> web.Response:
    replay = await _store(request).get(parse_path_id(request))
    return error(404, "not_found") if replay is None else json_document(200, replay.document())


async def cancel_route(request: web.Request) -> web.Response:
    replay_id = parse_path_id(request)
    store = _store(request)
    try:
        cancelled = await store.cancel(replay_id, _actor(request))
    except RunBusy:  # its runner held it past run_locks.WAIT_SECONDS
        return error(503, "run_busy", {"Retry-After": "5"})
    if not cancelled:
        return error(404, "not_found") if await store.get(replay_id) is None else error(409, "already_ended")
    return await show_route(request)


async def resume_route(request: web.Request) -> web.Response:
    replay_id = parse_path_id(request)
    try:
        asked = await request.json() if request.can_read_body else {}
    except ValueError:
        return error(400, "invalid_json")
    rate = parse_rate(asked.get("rate", DEFAULT_RATE) if isinstance(asked, dict) else None)
    if rate is None:
        return error(400, "invalid_rate")
    if not _publisher_ready(request):
        return error(503, "broker_unavailable", {"Retry-After": "5"})
    if await _store(request).get(replay_id) is None:
        return error(404, "not_found")
    return await _start(request, replay_id, rate)


async def _start(request: web.Request, replay_id: int, rate: float) -> web.Response:
    store = _store(request)
    replay = await store.claim(replay_id, rate)
    if replay is None:
        return error(409, "not_waiting")  # running elsewhere, finished or cancelled
    start(request, replay, store, _actor(request))
    return json_document(202, replay.document())


def start(request: web.Request, replay: EventReplay, store: EventReplayStore, actor: Actor) -> None:
    """Runs a claimed replay in this process's background (the console's Confirm uses it too)."""
    publisher = request.config_dict[publisher_key]

    def channel():
        if not publisher.ready or publisher.channel is None:
            raise ConnectionError("RabbitMQ is unreachable")
        return publisher.channel

    job = EventReplayJob(
        replay,
        actor,
        store,
        channel,
        request.config_dict[settings_key].namespace,
        sources=request.config_dict[sources_key],  # an ordered source's events go to their lanes
    )
    request.config_dict[event_replay_runner_key].start(job)


def parse_rate(value) -> float | None:
    """Events per second, MIN_RATE to MAX_RATE; None when it is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        rate = float(value)
    except ValueError:
        return None
    return rate if MIN_RATE <= rate <= MAX_RATE else None


def _filter_query(asked: dict) -> dict[str, str]:
    """The JSON object's filter as the search's query (strings; `payload` as
    JSON text). A name it does not know, or an empty value, is refused: left
    out, the filter would narrow nothing and the replay take every archived event."""
    unknown = sorted(name for name in asked if name not in _FILTER_NAMES and name not in _OTHER_NAMES)
    if unknown:
        raise InvalidFilter(unknown[0], "not a filter's name")
    query = {}
    for name in _FILTER_NAMES:
        value = asked.get(name)
        if value == "":
            raise InvalidFilter(name, "empty: leave it out to match any")
        if name == "payload" and isinstance(value, dict):
            value = json.dumps(value)
        if value is not None:
            query[name] = value if isinstance(value, str) else json.dumps(value)
    return query


def _publisher_ready(request: web.Request) -> bool:
    publisher = request.config_dict[publisher_key]
    return bool(publisher.ready and publisher.channel is not None)


def _actor(request: web.Request) -> Actor:
    return Actor(request[role_key], "admin-api")


def _store(request: web.Request) -> EventReplayStore:
    return EventReplayStore(request.config_dict[database_pool_key])
