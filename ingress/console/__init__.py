"""The on-call console (docs/reference.md §8.1): dead letters in a browser.

A sub-application of the ingress under `/console/`, mounted only when
`WEBHOOK_INGEST_ADMIN_TOKEN` is set (unset: 404, as the admin API). Pages
are rendered on the server (aiohttp-jinja2, autoescaping on) and work
without JavaScript; htmx, vendored in `static/` and pinned by version and
checksum (`vendor.py`), only refreshes figures and progress in place.
Nothing is loaded from another host. Sessions and CSRF: `security.py` and `sessions.py`.
It shares the admin API's dead-letter store (over the ingress's Postgres
pool) and the ingress's broker connection (a replay publishes on its
confirm-mode channel).
"""

import warnings
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp_jinja2
import jinja2
from aiohttp import web
from aiohttp.web_exceptions import NotAppKeyWarning
from aiohttp_session import session_middleware

from webhook_ingest.ingress.appkeys import database_pool_key
from webhook_ingest.shared.db import iso_utc
from webhook_ingest.shared.replays import keys as replay_keys
from webhook_ingest.shared.settings import Settings

from . import middlewares
from .bulk import BulkRunner
from .event_replays import add_event_replay_routes
from .events import add_event_routes, event_path
from .incidents import add_incident_routes
from .ordering import add_ordering_routes
from .rendering import human_bytes
from .security import cookie_storage
from .sessions import ConsoleSessions, console_sessions_key
from .sources import add_source_routes
from .vendor import HTMX_FILE
from .views import add_routes, bulk_runner_key

__all__ = ["setup_console"]

HERE = Path(__file__).parent
# aiohttp-session keeps its storage under plain string request keys; it
# works, and the warning would otherwise be logged by every ingress process.
warnings.filterwarnings("ignore", category=NotAppKeyWarning, module="aiohttp_session")


def setup_console(app: web.Application, settings: Settings) -> None:
    """After `database_ctx`: the sessions live in the ingress's Postgres."""
    if not settings.admin_token:
        return
    app.cleanup_ctx.append(_sessions_ctx)
    app.add_subapp("/console/", console_app(settings))
    app.router.add_get("/console", _to_console)


def console_app(settings: Settings) -> web.Application:
    console = web.Application(
        middlewares=[
            middlewares.bounded,
            session_middleware(cookie_storage(settings)),
            middlewares.security_headers,
            middlewares.expected_failures,
            middlewares.signed_in,
            middlewares.csrf_protected,
        ]
    )
    environment = aiohttp_jinja2.setup(console, loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True)
    environment.globals["htmx_file"] = HTMX_FILE
    environment.filters["when"] = lambda moment: iso_utc(moment).replace("+00:00", "Z") if moment else "—"
    environment.filters["size"] = human_bytes
    environment.filters["event_path"] = event_path
    environment.filters["replay_key_parts"] = replay_keys.parse  # (R, KEY) of replay-R/KEY, else None
    add_routes(console)
    add_event_routes(console)
    add_event_replay_routes(console)
    add_incident_routes(console)
    add_source_routes(console)
    add_ordering_routes(console)
    console.router.add_static("/static/", HERE / "static", append_version=True)
    console[bulk_runner_key] = BulkRunner()
    console.on_shutdown.append(console[bulk_runner_key].stop)
    return console


async def _sessions_ctx(app: web.Application) -> AsyncIterator[None]:
    app[console_sessions_key] = ConsoleSessions(app[database_pool_key])
    yield


async def _to_console(request: web.Request) -> web.Response:
    raise web.HTTPPermanentRedirect("/console/")
