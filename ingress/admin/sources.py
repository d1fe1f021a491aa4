"""The admin API's paused sources (docs/reference.md §8.3).

GET  /admin/sources                 each source: paused (by whom, since), events waiting parked
POST /admin/sources/{name}/pause
POST /admin/sources/{name}/resume
"""

from aiohttp import web

from webhook_ingest.ingress.appkeys import database_pool_key, settings_key, sources_key
from webhook_ingest.ingress.responses import error
from webhook_ingest.shared.audit import Actor
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.sources import PauseStore

from .common import json_document, role_key


def add_source_routes(admin: web.Application) -> None:
    admin.router.add_get("/sources", list_route)
    admin.router.add_post("/sources/{name}/pause", change_route(pause=True))
    admin.router.add_post("/sources/{name}/resume", change_route(pause=False))


async def source_states(request: web.Request) -> list[dict]:
    """Every source of the sources file: paused or not, and its parked events (None: unknown)."""
    known = request.config_dict[sources_key]
    names = sorted(known.keys())
    paused = await PauseStore(request.config_dict[database_pool_key]).paused()
    namespace = request.config_dict[settings_key].namespace
    queues = [topology.paused_queue(namespace, name) for name in names]
    depths = dict(await topology.queue_depths(request.config_dict[settings_key].amqp_url, queues, "admin-sources"))
    return [
        {
            "name": name,
            "paused": name in paused,
            "paused_by": paused[name]["paused_by"] if name in paused else None,
            "paused_at": paused[name]["paused_at"].isoformat() if name in paused else None,
            "waiting": depths[queue],
        }
        for name, queue in zip(names, queues)
    ]


async def list_route(request: web.Request) -> web.Response:
    return json_document(200, await source_states(request))


def change_route(pause: bool):
    async def route(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in request.config_dict[sources_key]:
            return error(404, "unknown_source")
        store = PauseStore(request.config_dict[database_pool_key])
        actor = Actor(request[role_key], "admin-api")
        changed = await (store.pause(name, actor) if pause else store.resume(name, actor))
        if not changed:
            return error(409, "already_paused" if pause else "not_paused")
        return json_document(200, {"name": name, "paused": pause})

    return route
