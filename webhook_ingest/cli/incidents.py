"""`webhook-ingest incidents …`: failures grouped into incidents (docs/oncall.md, "Incidents").

Like `dlq`, they need only `DATABASE_URL` (and `AMQP_URL` to replay).
"""

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import click

from webhook_ingest.shared.audit import Actor
from webhook_ingest.shared.dead_letters import DeadLetterStore, Replayed, parse_id
from webhook_ingest.shared.errors import WebhookIngestError
from webhook_ingest.shared.incidents import STATES, IncidentNotFound, IncidentStore, event_document, incident_document
from webhook_ingest.shared.settings import Settings

from .common import ENV_HELP, fail, run_or_fail, traced
from .dlq import _echo_json, _settings, age, confirm_channel, database, trimmed
from .terminal import echo

_IDS_MAY_LOOK_LIKE_OPTIONS = {"ignore_unknown_options": True}


@click.group(epilog=ENV_HELP)
def incidents() -> None:
    """Failures grouped by source, handler and error: list, show, acknowledge, resolve, replay, discard."""


@incidents.command("list", epilog=ENV_HELP)
@click.option("--state", default=None, type=click.Choice([*STATES, "all"]), help="only this state (default: all)")
@click.option("--limit", default=100, show_default=True, type=click.IntRange(min=1), help="at most this many")
@click.option("--json", "as_json", is_flag=True, help="one JSON array on stdout")
def list_command(state: str | None, limit: int, as_json: bool) -> None:
    """Incidents, unresolved first, then by their last failure."""
    wanted = None if state in (None, "all") else state
    rows = run_or_fail(_with_store(_settings(), lambda store: store.newest_first(wanted, limit)))
    documents = [incident_document(row) for row in rows]
    if as_json:
        _echo_json(documents)
    elif documents:
        echo(_table(documents, datetime.now(UTC)))
    else:
        echo("no incidents" + (f" in state {state}" if wanted else ""))


@incidents.command("show", epilog=ENV_HELP, context_settings=_IDS_MAY_LOOK_LIKE_OPTIONS)
@click.argument("incident_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="one JSON object on stdout")
def show_command(incident_id: str, as_json: bool) -> None:
    """One incident: its error, its history and its events."""
    parsed = _parse(incident_id)

    async def read(store: IncidentStore) -> dict:
        return {
            **incident_document(await store.get(parsed)),
            "history": await store.history(parsed),
            "events": [event_document(row) for row in await store.events(parsed)],
        }

    document = run_or_fail(_with_store(_settings(), read))
    if as_json:
        _echo_json(document)
        return
    echo(
        "\n".join(
            f"{name}: {document[name]}"
            for name in (
                "id",
                "state",
                "source",
                "handler",
                "error_type",
                "error_pattern",
                "last_error",
                "failures",
                "dead_letters",
                "first_seen",
                "last_seen",
                "acknowledged_by",
                "resolved_by",
            )
        )
    )
    for change in document["history"]:
        echo(f"  {change['at'].astimezone(UTC).isoformat()}  {change['state']:<13} by {change['actor']}")
    for event in document["events"]:
        echo(
            f"  event {event['event_id']}  failures {event['failures']}  dead letter "
            f"{event['dead_letter_id'] or '-'} ({event['dead_letter_status'] or 'retrying'})"
        )


@incidents.command("ack", epilog=ENV_HELP, context_settings=_IDS_MAY_LOOK_LIKE_OPTIONS)
@click.argument("incident_id", metavar="ID")
def ack_command(incident_id: str) -> None:
    """Acknowledge an open incident: someone is on it."""
    _change(incident_id, "acknowledged", "was not open; nothing done")


@incidents.command("resolve", epilog=ENV_HELP, context_settings=_IDS_MAY_LOOK_LIKE_OPTIONS)
@click.argument("incident_id", metavar="ID")
def resolve_command(incident_id: str) -> None:
    """Resolve an incident by hand (a new failure reopens it)."""
    _change(incident_id, "resolved", "was resolved already")


@incidents.command("replay", epilog=ENV_HELP, context_settings=_IDS_MAY_LOOK_LIKE_OPTIONS)
@click.argument("incident_id", metavar="ID")
def replay_command(incident_id: str) -> None:
    """Replay the incident's open dead letters (as `dlq replay` does each)."""
    settings = _settings()
    traced("cli")  # each replay a trace of its own
    done: Replayed = run_or_fail(_replay(settings, _parse(incident_id)))
    echo(
        f"replayed {len(done.replayed)}" + (f", skipped {len(done.skipped)} changed meanwhile" if done.skipped else "")
    )


@incidents.command("discard", epilog=ENV_HELP, context_settings=_IDS_MAY_LOOK_LIKE_OPTIONS)
@click.argument("incident_id", metavar="ID")
def discard_command(incident_id: str) -> None:
    """Discard the incident's open dead letters (kept for audit)."""

    async def discard(connection, ids: list[int]) -> list[int]:
        return await DeadLetterStore(connection).discard(ids, Actor.cli()) if ids else []

    echo(f"discarded {len(run_or_fail(_open_dead_letters(_settings(), _parse(incident_id), discard)))}")


def _change(incident_id: str, state: str, unchanged: str) -> None:
    parsed = _parse(incident_id)
    changed = run_or_fail(_with_store(_settings(), lambda store: store.change(parsed, state, str(Actor.cli()))))
    echo(f"incident {parsed} {state}" if changed else f"incident {parsed} {unchanged}")


def _parse(text: str) -> int:
    parsed = parse_id(text)
    if parsed is None:
        fail(f"invalid incident id {text!r}: ids are positive integers")
    return parsed


class NoSuchIncident(WebhookIngestError):
    pass


async def _with_store(settings: Settings, use: Callable[[IncidentStore], Awaitable[Any]]) -> Any:
    async with database(settings) as connection:
        try:
            return await use(IncidentStore(connection))
        except IncidentNotFound as exc:
            raise NoSuchIncident(f"there is no incident {exc.args[0]}") from None


async def _open_dead_letters(settings: Settings, incident_id: int, act: Callable[..., Awaitable[Any]]) -> Any:
    """`act(connection, ids)` on the incident's open dead letters."""
    async with database(settings) as connection:
        incidents = IncidentStore(connection)
        try:
            await incidents.get(incident_id)
        except IncidentNotFound:
            raise NoSuchIncident(f"there is no incident {incident_id}") from None
        return await act(connection, await incidents.open_dead_letter_ids(incident_id))


async def _replay(settings: Settings, incident_id: int) -> Replayed:
    async def replay(connection, ids: list[int]) -> Replayed:
        if not ids:
            return Replayed([], [])
        async with confirm_channel(settings) as channel:
            return await DeadLetterStore(connection).replay(channel, settings.namespace, ids=ids, actor=Actor.cli())

    return await _open_dead_letters(settings, incident_id, replay)


def _table(documents: list[dict], now: datetime) -> str:
    header = ("ID", "STATE", "SOURCE", "HANDLER", "FAILURES", "DEAD", "LAST SEEN", "ERROR")
    lines = [
        (
            str(d["id"]),
            d["state"],
            d["source"],
            trimmed(d["handler"], 30),
            str(d["failures"]),
            str(d["dead_letters"]),
            age(now - datetime.fromisoformat(d["last_seen"])) + " ago",
            trimmed(f"{d['error_type']}: {d['error_pattern']}", 70),
        )
        for d in documents
    ]
    widths = [max(len(line[column]) for line in [header, *lines]) for column in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths)) + "  " + line[-1] for line in [header, *lines]
    )
