"""What the admin API's modules share: the request and application keys,
the path's `{id}`, the JSON answer. Below `api.py` and the routes' modules
alike, so that `api.py` imports those modules at its top and they import
this one, never `api.py`."""

from aiohttp import web

from webhook_ingest.shared.db import to_json
from webhook_ingest.shared.dead_letters import DeadLetterStore, parse_id

dead_letters_key = web.AppKey("dead_letters", DeadLetterStore)
role_key = web.RequestKey("admin_role", str)


class BadId(Exception):
    """A path's `{id}` that is none: 400 `invalid_id`, by api.py's middleware."""


def parse_path_id(request: web.Request) -> int:
    """The `{id}` of the path; 400 `invalid_id` (by the middleware) when it is none."""
    parsed = parse_id(request.match_info["id"])
    if parsed is None:
        raise BadId()
    return parsed


def json_document(status: int, document: object) -> web.Response:
    return web.Response(status=status, body=to_json(document), content_type="application/json")
