"""The Events page's search (docs/reference.md §8.1): its query string — or
a form posted with the same fields — to the event archive's filter, read by
the parser the admin API and the CLI use (shared/archive/search.py), the
page cursor, the form's values as typed, and what was wrong in words for
the page. A filter with a problem is not applied at all: the page says
what is wrong rather than showing (or acting on) more than was asked.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

from webhook_ingest.shared.archive import Cursor, EventFilter, InvalidFilter, filter_and_problems

from .filters import query_string

# the admin API's query parameters, in the form's order
FIELDS = ("source", "status", "type", "since", "until", "key", "event_id", "payload")
LABELS = {
    "source": "Source",
    "status": "Status",
    "type": "Event type",
    "since": "From",
    "until": "Until",
    "key": "Key prefix",
    "event_id": "Event id prefix",
    "payload": "Payload contains",
}
MAX_VALUE = 4000  # a URL's line is at most 8 KiB anyway
SHOWN_INPUT = 60  # of a bad value, quoted back in its message


@dataclass(frozen=True)
class EventSearch:
    where: EventFilter
    after: Cursor | None  # the page below this row; None: the newest
    values: dict[str, str]  # the form as typed (trimmed), to show again and to carry to the next page
    problems: list[str] = field(default_factory=list)  # the filter's; non-empty: search nothing
    cursor_problem: str | None = None  # a page link that is not one: the newest page instead

    def query(self, **extra: str) -> str:
        """This search (plus `extra`, e.g. the next page's cursor) as a URL query."""
        return query_string(self.values, **extra)


def event_search(query: Mapping[str, str]) -> EventSearch:
    """The search a query string (or a form) asks for; never raises."""
    typed = form_values(query)
    where, invalid = filter_and_problems(typed)
    after, cursor_problem = _cursor(query.get("cursor"))
    values = {name: displayable(value) for name, value in typed.items()}
    return EventSearch(where, after, values, [_sentence(problem, values) for problem in invalid], cursor_problem)


def form_values(query: Mapping[str, str]) -> dict[str, str]:
    """Each field as typed, trimmed and bounded; "" when absent."""
    values = {}
    for name in FIELDS:
        value = query.get(name)
        values[name] = value.strip()[:MAX_VALUE] if isinstance(value, str) else ""
    return values


def displayable(text: str) -> str:
    """`text` as a page can hold it: a NUL or an unpaired surrogate (which
    the filter refuses) shown as its escape, not failing the page's encoding."""
    return text.replace("\x00", "\\x00").encode("utf-8", errors="backslashreplace").decode()


def _cursor(text) -> tuple[Cursor | None, str | None]:
    if not isinstance(text, str) or not text:
        return None, None
    try:
        return Cursor.decode(text[:MAX_VALUE]), None
    except InvalidFilter:
        return None, "The page link is not valid; showing the newest events."


def _sentence(problem: InvalidFilter, values: Mapping[str, str]) -> str:
    typed = values.get(problem.field, "")
    shown = typed if len(typed) <= SHOWN_INPUT else typed[:SHOWN_INPUT] + "…"
    what = str(problem).split(": ", 1)[-1]
    return f"{LABELS.get(problem.field, problem.field)}: “{shown}” is not valid — {what}."
