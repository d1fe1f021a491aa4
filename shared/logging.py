"""One `configure_logging()` for every process.

JSON lines (rendered by orjson) when stdout is not a terminal, a readable
console renderer on one. Context (`source`, `key`, `attempt`) is bound per
request and per message with contextvars, since one task serves many.
"""

import logging
import sys

import orjson
import structlog


def configure_logging(log_format: str | None = None, level: int = logging.INFO) -> None:
    if log_format is None:
        log_format = "console" if sys.stderr.isatty() else "json"
    shared_processors = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if log_format == "json":
        renderer = structlog.processors.JSONRenderer(serializer=_orjson_dumps)
        processors = [*shared_processors, structlog.processors.format_exc_info, renderer]
        factory = structlog.BytesLoggerFactory(sys.stderr.buffer)
    else:
        processors = [*shared_processors, structlog.dev.ConsoleRenderer()]
        factory = structlog.PrintLoggerFactory(sys.stderr)
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=factory,
        cache_logger_on_first_use=True,
    )


def _orjson_dumps(event_dict, default=None) -> bytes:
    return orjson.dumps(event_dict, default=str)


def get_logger(name: str | None = None):
    return structlog.get_logger(name)
