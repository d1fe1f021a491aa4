"""Rendering a console page: every template gets the signed-in role, the
session's CSRF token (for its forms) and the messages left for it by the
request before (post/redirect/get)."""

import aiohttp_jinja2
from aiohttp import web
from aiohttp_session import get_session

from webhook_ingest.ingress.tokens import may_change

from .security import csrf_token, role_key


async def render(
    request: web.Request,
    template: str,
    context: dict,
    status: int = 200,
    headers: dict[str, str] | None = None,
    without_session: bool = False,
) -> web.Response:
    """`without_session`: for a page saying Postgres is away, where the
    session (its key, its row) may be what could not be read."""
    role = request.get(role_key)
    base = {
        "role": role,
        "may_change": may_change(role),
        "path": request.path,
        "csrf_token": "" if without_session else await csrf_token(request),
        "messages": [] if without_session else await take_messages(request),
    }
    response = aiohttp_jinja2.render_template(template, request, base | context, status=status)
    response.headers.update(headers or {})
    return response


async def message_page(
    request: web.Request,
    status: int,
    title: str,
    text: str,
    headers: dict[str, str] | None = None,
    without_session: bool = False,
) -> web.Response:
    return await render(request, "message.html", {"title": title, "text": text}, status, headers, without_session)


async def leave_message(request: web.Request, kind: str, text: str) -> None:
    """Shown once, on the next page this session renders (`kind`: ok or error)."""
    session = await get_session(request)
    session["messages"] = [*session.get("messages", []), [kind, text]]


async def take_messages(request: web.Request) -> list[list[str]]:
    session = await get_session(request)
    return session.pop("messages", []) if "messages" in session else []


def human_bytes(size: int | None) -> str:
    """1,234 bytes, 12.3 MiB: a size on disk as the overview shows it."""
    if size is None:
        return "n/a"
    amount, unit = float(size), "bytes"
    for larger in ("KiB", "MiB", "GiB", "TiB"):
        if amount < 1024:
            break
        amount, unit = amount / 1024, larger
    return f"{size:,} bytes" if unit == "bytes" else f"{amount:,.1f} {unit}"
