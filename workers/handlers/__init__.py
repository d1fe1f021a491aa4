"""The handler interface (docs/reference.md §7) and how a source's `handler` is found.

    async def handle(event, ctx) -> dict | None

`event` carries source, event_id, key, payload, headers, received_at,
attempt; `ctx` carries db (the asyncpg connection inside the completion
transaction), options (the source's handler_options) and logger. Raising
`PermanentError` dead-letters the event at once; anything else is retried.

Handlers are looked up here only, by the processes that run them: `worker`
(and `run`, before it starts any) refuse to start on a source whose handler
cannot be loaded; the ingress never imports handler code.
"""

import importlib
import inspect
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from webhook_ingest.shared.errors import ConfigError

from .interface import Event as Event
from .interface import Handler as Handler
from .interface import HandlerContext as HandlerContext
from .interface import PermanentError as PermanentError
from .interface import Replay as Replay
from .interface import replay_of as replay_of

__all__ = [
    "Event",
    "Handler",
    "HandlerContext",
    "PermanentError",
    "Replay",
    "batch_form",
    "handler_key",
    "load_handlers",
    "replay_of",
]

if TYPE_CHECKING:  # the handler API stays light to import
    from webhook_ingest.shared.sources import Source

BUILTINS = ("forward", "inbox")


def load_handlers(sources: Mapping[str, "Source"]) -> dict[str, Handler]:
    """Every source's handler, by `handler_key`, or a one-line ConfigError
    naming the source and the field whose handler cannot run."""
    handlers = {}
    for name, source in sources.items():
        if not source.routes:
            handlers[name] = _handler(source.name, "", source.handler, source.handler_options)
        for index, route in enumerate(source.routes):
            handlers[handler_key(name, route.name)] = _handler(
                source.name, f"routes[{index}].", route.handler, route.handler_options
            )
    return handlers


def handler_key(source: str, route: str) -> str:
    """What `load_handlers` files a handler under: the source, or `SOURCE#ROUTE`."""
    return f"{source}#{route}" if route else source


def _handler(source: str, where: str, reference: str, options: Mapping[str, Any]) -> Handler:
    try:
        handle = load_handler(reference)
    except ConfigError as exc:
        raise ConfigError(f"source {source!r}: {where}handler: {exc}") from None
    if reference == "forward":
        _check_forward_options(source, where, options)
    return handle


def _check_forward_options(source: str, where: str, options: Mapping[str, Any]) -> None:
    from webhook_ingest.workers.delivery_rate import delivery_rate

    if not isinstance(options.get("url"), str):
        raise ConfigError(f"source {source!r}: {where}handler_options.url: the forward handler needs a url")
    try:
        delivery_rate(options)
        _check_forward_headers(options.get("headers", {}))
    except ValueError as exc:
        raise ConfigError(f"source {source!r}: {where}handler_options.{exc}") from None


def _check_forward_headers(headers: Any) -> None:
    from .forward import OWN_HEADERS, sent_headers

    if not isinstance(headers, dict) or not all(isinstance(value, str) for value in headers.values()):
        raise ValueError("headers: a table of header names and string values (a value may be env:NAME or file:/path)")
    for name in headers:
        if name.lower() in OWN_HEADERS:
            raise ValueError(f"headers.{name}: forward sets this header itself")
    sent_headers({"headers": headers})  # every secret there, or the worker does not start


def load_handler(reference: str) -> Handler:
    """A built-in name (`inbox`, `forward`) or `module:function`; ConfigError
    saying why when it names no callable."""
    if reference == "inbox":
        from . import inbox

        return inbox.handle
    if reference == "forward":
        from . import forward

        return forward.handle
    return _imported(reference)


def _imported(reference: str) -> Handler:
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise ConfigError(f"{reference!r} is neither a built-in ({', '.join(BUILTINS)}) nor 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"cannot import {module_name!r}: {exc}{_where_to_put(module_name, exc)}") from exc
    handle = getattr(module, attribute, None)
    if not callable(handle):
        raise ConfigError(f"{module_name!r} has no callable {attribute!r}")
    if not _is_async(handle):
        raise ConfigError(
            f"{reference!r} is not an async function: the worker awaits it, so write"
            f" 'async def {attribute}(event, ctx)'"
        )
    if batch_form(handle) is not None and not _is_async(handle.batch):
        raise ConfigError(f"{reference!r}.batch is not an async function: write 'async def (events, ctx)'")
    return handle


def batch_form(handle: Any) -> Any:
    """The handler's batch form (`handle.batch`, docs/reference.md §7), or None.
    Not one that functools.wraps copied onto a wrapper from the function it
    wraps (wraps copies `__dict__`): calling it would skip the wrapper's own
    work, so the wrapper runs for each event instead."""
    batch = getattr(handle, "batch", None)
    wrapped = getattr(handle, "__wrapped__", None)
    if batch is not None and wrapped is not None and getattr(wrapped, "batch", None) is batch:
        return None
    return batch


def _where_to_put(module_name: str, exc: ImportError) -> str:
    """What to do about a module not found: the handler's own module, or one it imports."""
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if missing is None:
        return ""
    if module_name == missing or module_name.startswith(f"{missing}."):
        return (
            f"; install it into this Python environment ({sys.prefix}) or put its folder on PYTHONPATH"
            " (the current directory is not on the webhook-ingest command's import path)"
        )
    return f"; install {missing!r} into this Python environment ({sys.prefix})"


def _is_async(handle: Any) -> bool:
    """An `async def` function (also behind functools.partial) or an object
    whose `__call__` is one; a plain function's `None` cannot be awaited."""
    return inspect.iscoroutinefunction(handle) or inspect.iscoroutinefunction(handle.__call__)
