"""One `configure_logging()` for every process.

JSON lines (rendered by orjson) when stdout is not a terminal, a readable
console renderer on one. Context (`source`, `key`, `attempt`) is bound per
request and per message with contextvars, since one task serves many; with
tracing on, a line made inside a trace carries its `trace_id` and `span_id`
(shared/observability/tracing.py; off, that step returns at once).
Libraries' own warnings (stdlib `logging`: asyncpg, aio-pika, aiohttp) are
rendered the same way, so a JSON log stays one object per line — a
traceback goes into its `exception` field instead of across forty lines.
No line carries a URL's user, password or query (`_redact_urls`,
shared/errors.py): an error or a traceback repeats the URL it was given.
"""

import logging
import sys
from collections.abc import Callable, MutableMapping
from typing import Any

import orjson
import structlog
from structlog.typing import EventDict, Processor

from webhook_ingest.shared.errors import redacted
from webhook_ingest.shared.storable_text import cleaned, storable

from . import tracing
from .loggers import get_logger as get_logger  # re-exported: the package imports it from here


def configure_logging(log_format: str | None = None, level: int = logging.INFO) -> None:
    if log_format is None:
        log_format = "console" if sys.stderr.isatty() else "json"
    shared_processors: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        tracing.add_trace_ids,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    processors: list[Processor]
    if log_format == "json":
        processors = [*shared_processors, structlog.processors.format_exc_info, _redact_urls, _json_renderer(bytes)]
        factory: structlog.BytesLoggerFactory | structlog.PrintLoggerFactory
        factory = structlog.BytesLoggerFactory(sys.stderr.buffer)
    else:
        processors = [*shared_processors, _redact_urls, structlog.dev.ConsoleRenderer()]
        factory = structlog.PrintLoggerFactory(sys.stderr)
    _route_library_logging(shared_processors, processors[-1], level)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )


def _route_library_logging(shared_processors: list[Processor], renderer: Processor, level: int) -> None:
    if isinstance(renderer, structlog.processors.JSONRenderer):
        renderer = _json_renderer(str)  # a logging.Handler writes text
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[*shared_processors, structlog.stdlib.add_logger_name],
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                _redact_urls,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(level, logging.WARNING))  # libraries' info lines are noise here


def _redact_urls(logger: Any, method_name: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for name, value in event_dict.items():
        if isinstance(value, str) and "://" in value:
            event_dict[name] = redacted(value)
    return event_dict


def _json_renderer(kind: type) -> structlog.processors.JSONRenderer:
    def dumps(event_dict: EventDict, default: Callable[[Any], Any] | None = None) -> bytes | str:
        try:
            rendered = orjson.dumps(event_dict, default=str)
        except TypeError:  # a lone surrogate (orjson refuses it): a log line never raises into its caller
            rendered = orjson.dumps(cleaned(event_dict), default=lambda value: storable(str(value)))
        return rendered if kind is bytes else rendered.decode()

    return structlog.processors.JSONRenderer(serializer=dumps)
