"""The console's Sources page (docs/reference.md §8.3): each source, paused
or running, how many of its events wait parked, and (for the operator)
Pause and Resume — audited, reaching every worker within about a second."""

from aiohttp import web

from webhook_ingest.ingress.admin import source_states
from webhook_ingest.ingress.appkeys import database_pool_key, sources_key
from webhook_ingest.shared.audit import Actor
from webhook_ingest.shared.sources import PauseStore

from .rendering import leave_message, render
from .security import role_key

routes = web.RouteTableDef()


def add_source_routes(console: web.Application) -> None:
    console.router.add_routes(routes)


@routes.get("/sources")
async def sources_page(request: web.Request) -> web.Response:
    return await render(request, "sources.html", {"sources": await source_states(request)})


@routes.post("/sources/{name}/pause")
async def pause(request: web.Request) -> web.Response:
    return await _change(request, pause=True)


@routes.post("/sources/{name}/resume")
async def resume(request: web.Request) -> web.Response:
    return await _change(request, pause=False)


async def _change(request: web.Request, pause: bool) -> web.Response:
    name = request.match_info["name"]
    if name not in request.config_dict[sources_key]:
        raise web.HTTPNotFound()
    store = PauseStore(request.config_dict[database_pool_key])
    actor = Actor(request[role_key], "console")
    changed = await (store.pause(name, actor) if pause else store.resume(name, actor))
    if changed:
        text = (
            f"Source {name} paused: its events are accepted and kept until you resume it."
            if pause
            else f"Source {name} resumed: the events kept meanwhile are processed, oldest first."
        )
    else:
        text = f"Source {name} was {'already paused' if pause else 'not paused'}: nothing done."
    await leave_message(request, "ok" if changed else "error", text)
    raise web.HTTPSeeOther("/console/sources")
