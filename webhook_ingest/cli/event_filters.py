"""The archive search's filters as options, shared by `events list`,
`events export` and `events replay`, and the sources file's routes they
search with: below events.py and events_replay.py both, so that neither
imports the other's module for them."""

import click

from webhook_ingest.shared.archive import STATUSES, EventFilter, SourceRoutes, parse_filter
from webhook_ingest.shared.errors import ConfigError
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources import Source, load_sources

from .terminal import echo

FILTER_OPTIONS = [
    click.option("--source", default=None, help="only this source"),
    click.option("--status", default=None, type=click.Choice(STATUSES), help="only this status"),
    click.option("--type", "event_type", default=None, help="only this event type (exact)"),
    click.option("--since", default=None, help="received at or after this ISO 8601 time (UTC without an offset)"),
    click.option("--until", default=None, help="received before this ISO 8601 time"),
    click.option("--key", default=None, help="keys starting with this (SOURCE:EVENT_ID)"),
    click.option("--event-id", default=None, help="event ids starting with this"),
    click.option(
        "--payload", default=None, help='bodies containing this JSON object, e.g. \'{"customer": "cus_123"}\''
    ),
]


def filter_options(command):
    """The archive search's filters (list, export, replay): the admin API's, as options."""
    for option in reversed(FILTER_OPTIONS):
        command = option(command)
    return command


def cli_filter(source, status, event_type, since, until, key, event_id, payload) -> EventFilter:
    """The options' filter; raises InvalidFilter naming the field."""
    return parse_filter(
        {
            "source": source,
            "status": status,
            "type": event_type,
            "since": since,
            "until": until,
            "key": key,
            "event_id": event_id,
            "payload": payload,
        }
    )


def source_routes(settings: Settings) -> SourceRoutes:
    """Every route of the sources file: a routed event is `processing` while
    one of its routes holds its lease (KEY#ROUTE)."""
    return SourceRoutes.of(
        readable_sources(
            settings, "an event of a source with routes shows `queued`, not `processing`, while its routes run it"
        )
    )


def readable_sources(settings: Settings, without_them: str) -> dict[str, Source]:
    """The sources file's sources, for their routes; none, and a warning that
    says `without_them`, when the file cannot be read here (a secret it names
    unset in this shell: these commands need only DATABASE_URL)."""
    try:
        return load_sources(settings.sources_path)
    except ConfigError as exc:
        echo(f"warning: {exc}; {without_them}", err=True)
        return {}
