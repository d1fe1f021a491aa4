"""The dead-letter filter from a query string or a form, and back.

Whatever a person (or a bookmark, or a crawler) puts in the URL becomes
either a filter or a list of plain-language problems — never an exception.
A filter with a problem is not applied at all: the page says what is wrong
instead of quietly showing (or bulk-acting on) more than was asked.
"""

from collections.abc import Mapping
from datetime import UTC, datetime
from urllib.parse import urlencode

from webhook_ingest.shared.dead_letters import MAX_ID, STATUSES, DeadLetterFilter, parse_id

MAX_TEXT = 200
MAX_NAME = 200
FIELDS = ("source", "status", "error_type", "since", "until", "q")


def parse_filter(query: Mapping[str, str]) -> tuple[DeadLetterFilter, list[str]]:
    """The filter, and what was wrong with the input (empty: nothing)."""
    problems: list[str] = []
    status = _text(query, "status") or "dead"
    if status not in (*STATUSES, "all"):
        problems.append(f"Status must be one of {', '.join(STATUSES)} or all.")
    since, until = _moment(query, "since", problems), _moment(query, "until", problems)
    if since and until and since >= until:
        problems.append("The time range is empty: “from” must be before “until”.")
    text = _text(query, "q")
    if text and len(text) > MAX_TEXT:
        problems.append(f"The search text is too long ({len(text)} characters; at most {MAX_TEXT}).")
    source, error_type = _text(query, "source"), _text(query, "error_type")
    for label, value in (("Source", source), ("Error type", error_type)):
        if value and len(value) > MAX_NAME:
            problems.append(f"{label} is too long (at most {MAX_NAME} characters).")
    where = DeadLetterFilter(
        source=source,
        status=None if status == "all" else status,
        error_type=error_type,
        since=since,
        until=until,
        text=text,
    )
    return where, problems


def parse_before(query: Mapping[str, str]) -> tuple[int | None, list[str]]:
    """The page cursor: only ids below this one."""
    raw = _text(query, "before")
    if raw is None:
        return None, []
    before = parse_id(raw)
    if before is None or before > MAX_ID:
        return None, ["The page link is not valid; showing the newest."]
    return before, []


def form_values(query: Mapping[str, str]) -> dict[str, str]:
    """What the filter form shows again: the input as typed (trimmed, bounded)."""
    return {name: (_text(query, name) or "")[: MAX_TEXT * 2] for name in FIELDS}


def query_string(values: Mapping[str, str], **extra) -> str:
    """The filter (plus `extra`, e.g. the next page) as a URL query."""
    pairs = {name: value for name, value in values.items() if value} | {k: v for k, v in extra.items() if v}
    return urlencode(pairs)


def _text(query: Mapping[str, str], name: str) -> str | None:
    value = query.get(name)
    if not isinstance(value, str):
        return None
    value = value.replace("\x00", "").strip()  # NULs first: the strip must see what is left
    return value or None


def _moment(query: Mapping[str, str], name: str, problems: list[str]) -> datetime | None:
    """An ISO date or date-time (what `<input type=datetime-local>` sends); UTC unless it says otherwise."""
    raw = _text(query, name)
    if raw is None:
        return None
    try:
        moment = datetime.fromisoformat(raw[:64])
    except ValueError:
        problems.append(f"“{raw[:40]}” is not a date and time (for example 2026-11-23T14:30).")
        return None
    if not datetime(1970, 1, 1) <= moment.replace(tzinfo=None) <= datetime(9999, 1, 1):
        problems.append(f"“{raw[:40]}” is out of range.")
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
