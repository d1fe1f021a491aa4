"""webhook_ingest.shared.archive: what each of its modules holds.

- model     The event archive, as plain code (docs/design.md, "The archive")
- store     The event archive's Postgres
- writer    Rows written behind their callers' backs, in batches
- settling  Settling the event archive from what Postgres itself recorded (docs/design.md, "The settling sweep")
- search    Searching the event archive
"""

from .search import (
    COUNT_CAP,
    DEFAULT_LIMIT,
    MAX_LIMIT,
    NO_ROUTES,
    STATUSES,
    Cursor,
    EventFilter,
    InvalidFilter,
    SourceRoutes,
    completion,
    exported,
    filter_and_problems,
    page,
    parse_filter,
    parse_limit,
    parse_text,
    route_completions,
    route_names,
)
from .store import ArchiveStore, NamedCursor
from .writer import BatchedWriter, is_outage

__all__ = [
    "COUNT_CAP",
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "NO_ROUTES",
    "STATUSES",
    "ArchiveStore",
    "BatchedWriter",
    "Cursor",
    "EventFilter",
    "InvalidFilter",
    "NamedCursor",
    "SourceRoutes",
    "completion",
    "exported",
    "filter_and_problems",
    "is_outage",
    "model",
    "page",
    "parse_filter",
    "parse_limit",
    "parse_text",
    "route_completions",
    "route_names",
    "settling",
    "store",
]
