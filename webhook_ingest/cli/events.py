"""`webhook-ingest events …`: search the event archive, read an event, export a selection
(docs/reference.md §2). Like `dlq`, they need only `DATABASE_URL`; `events show`
also reads the sources file for the routes of a routed event's source (each
route's completion), and says so on stderr, showing none, when it cannot.

The filters and the JSON documents are the admin API's
(`shared/archive/search.py`).
"""

import json
import os
import sys
from datetime import UTC, datetime
from typing import BinaryIO

import click

from webhook_ingest.shared.archive import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    ArchiveStore,
    Cursor,
    EventFilter,
    InvalidFilter,
    exported,
    page,
    route_names,
)
from webhook_ingest.shared.errors import WebhookIngestError
from webhook_ingest.shared.settings import Settings

from .common import ENV_HELP, fail, run_or_fail
from .dlq import _echo_json, _indented_json, _settings, age, database, trimmed
from .event_filters import cli_filter, filter_options, readable_sources, source_routes
from .events_replay import replay
from .terminal import echo, one_line


@click.group(epilog=ENV_HELP)
def events() -> None:
    """The event archive: every accepted event, whatever became of it."""


events.add_command(replay)  # `events replay`: its own module


@events.command("list", epilog=ENV_HELP)
@filter_options
@click.option(
    "--limit",
    default=DEFAULT_LIMIT,
    show_default=True,
    type=click.IntRange(1, MAX_LIMIT),
    help="at most this many (newest first)",
)
@click.option("--cursor", default=None, help="the page after the one whose `next` this is")
@click.option("--json", "as_json", is_flag=True, help="one JSON object on stdout")
def list_command(source, status, event_type, since, until, key, event_id, payload, limit, cursor, as_json) -> None:
    """Archived events, newest first: one page, and how many match."""
    try:
        where = cli_filter(source, status, event_type, since, until, key, event_id, payload)
        after = Cursor.decode(cursor) if cursor else None
    except InvalidFilter as exc:
        fail(f"invalid --{exc.field.replace('_', '-')}: {exc}")
    document = run_or_fail(_page(_settings(), where, after, limit))
    if as_json:
        _echo_json(document)
        return
    echo(_table(document["events"], datetime.now(UTC)) if document["events"] else "no archived events")
    if document["count"] is not None:
        echo(f"{document['count']}{'+' if document['count_capped'] else ''} matching")
    if document["next"]:
        echo(f"more: --cursor {document['next']}")


@events.command("show", epilog=ENV_HELP)
@click.argument("key")
@click.option("--json", "as_json", is_flag=True, help="one JSON object on stdout")
def show_command(key: str, as_json: bool) -> None:
    """One event (SOURCE:EVENT_ID): every arrival of its key, its completion (each route's), its dead letters."""
    settings = _settings()
    document = run_or_fail(_event(settings, key, _route_names(settings, key)))
    if as_json:
        _echo_json(document)
        return
    echo(f"key: {document['key']}")
    completion = document["completion"]
    for route, done in document["completions"].items():
        echo(
            f"completed, route {route}: {done['completed_at']} (attempt {done['attempts']})"
            if done
            else f"completed, route {route}: no (or pruned)"
        )
    if completion or not document["completions"]:
        echo(
            f"completed: {completion['completed_at']} (attempt {completion['attempts']})"
            if completion
            else "completed: no (or pruned)"
        )
    for dead_letter in document["dead_letters"]:
        route = f" (route {dead_letter['route']})" if dead_letter.get("route") else ""
        echo(f"dead letter {dead_letter['id']}: {dead_letter['status']}{route}")
    for arrival in document["arrivals"]:
        echo(
            f"\narrival {arrival['received_at']}  {arrival['status']}  type {arrival['event_type'] or '-'}"
            f"  attempts {arrival['attempts']}"
            + (f"  last error: {arrival['last_error']}" if arrival["last_error"] else "")
        )
        echo(f"headers:\n{_indented_json(arrival['headers'])}")
        payload = arrival["payload"]
        echo(
            f"payload:\n{_indented_json(payload)}"
            if payload is not None
            else f"body:\n  {arrival.get('body') or '(not yet archived)'}"
        )


@events.command("export", epilog=ENV_HELP)
@filter_options
@click.option(
    "--output",
    "-o",
    default=None,
    type=click.Path(dir_okay=False, writable=True),
    help="write to this file instead of stdout",
)
def export_command(source, status, event_type, since, until, key, event_id, payload, output) -> None:
    """Every archived event the filter matches as JSON lines, newest first: headers and body included."""
    try:
        where = cli_filter(source, status, event_type, since, until, key, event_id, payload)
    except InvalidFilter as exc:
        fail(f"invalid --{exc.field.replace('_', '-')}: {exc}")
    if output is None:
        _export_or_closed(_settings(), where, sys.stdout.buffer)
        return
    with open(output, "wb") as sink:
        _export_or_closed(_settings(), where, sink)


def _export_or_closed(settings: Settings, where: EventFilter, sink: BinaryIO) -> None:
    """The export; a reader that stops reading (`| head`) ends it quietly, exit 0."""
    if not run_or_fail(_export(settings, where, sink)):
        # Python would flush stdout again at exit and complain: point it at nothing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


async def _export(settings: Settings, where: EventFilter, sink: BinaryIO) -> bool:
    """One page in memory at a time; each written, then the next fetched (a
    CLI's own loop, nothing else waits on it). False when the reader went away."""
    async with database(settings) as connection:
        async for rows in ArchiveStore(connection).export(where, routes=source_routes(settings)):
            try:
                sink.write(b"".join(json.dumps(exported(row), separators=(",", ":")).encode() + b"\n" for row in rows))
                sink.flush()
            except BrokenPipeError:  # inside `database`, an OSError would read as Postgres's
                return False
    return True


class NoSuchEvent(WebhookIngestError):
    pass


async def _page(settings: Settings, where: EventFilter, after: Cursor | None, limit: int) -> dict:
    async with database(settings) as connection:
        store, routes = ArchiveStore(connection), source_routes(settings)
        rows = await store.search(where, after, limit, routes)
        return page(rows, await store.count(where, routes=routes) if after is None else None, limit)


def _route_names(settings: Settings, key: str) -> list[str]:
    """The routes of the key's source, from the sources file."""
    return route_names(
        readable_sources(
            settings, "each route's completion is not shown (nor `processing` while a route runs the event)"
        ),
        key,
    )


async def _event(settings: Settings, key: str, routes: list[str]) -> dict:
    async with database(settings) as connection:
        document = await ArchiveStore(connection).event(key, routes)
    if document is None:
        raise NoSuchEvent(f"no archived event with key {key!r}")
    return document


def _table(rows: list[dict], now: datetime) -> str:
    lines = [f"{'RECEIVED':<10} {'SOURCE':<12} {'STATUS':<10} {'TYPE':<20} {'ATTEMPTS':>8}  EVENT ID / LAST ERROR"]
    for row in rows:
        received = age(now - datetime.fromisoformat(row["received_at"]))
        detail = one_line(row["event_id"]) + (f"  {trimmed(row['last_error'], 60)}" if row["last_error"] else "")
        lines.append(
            f"{received:<10} {trimmed(row['source'], 12):<12} {row['status']:<10} "
            f"{trimmed(row['event_type'] or '-', 20):<20} {row['attempts']:>8}  {detail}"
        )
    return "\n".join(lines)
