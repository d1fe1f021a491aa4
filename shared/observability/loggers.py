"""`get_logger()`, alone: what logging.py and tracing_otel.py both use,
below both. logging.py imports tracing.py (its processor puts a line's
trace ids on it), and tracing.py loads tracing_otel.py when tracing starts,
which logs; with the getter here, none of them imports one above it."""

import structlog
from structlog.typing import FilteringBoundLogger


def get_logger(name: str | None = None) -> FilteringBoundLogger:
    return structlog.get_logger(name)
