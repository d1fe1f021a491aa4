"""JSON answers of the ingress (docs/reference.md §6)."""

import orjson
from aiohttp import web


class Rejected(Exception):
    """A check failed; `response` is the answer."""

    def __init__(self, response: web.Response):
        self.response = response


def json_response(status: int, document: object, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=orjson.dumps(document), content_type="application/json", headers=headers)


def error(status: int, code: str, headers: dict[str, str] | None = None) -> web.Response:
    return json_response(status, {"error": code}, headers)
