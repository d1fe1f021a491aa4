"""`webhook-ingest events replay …`: replay the archived events a filter
matches (docs/reference.md §2, §8 "Replaying archived events").

    events replay --source stripe --type invoice.paid --since 14:00… --until 15:10… --dry-run
    events replay --source stripe --type invoice.paid --since … --until … [--rate 10] [--yes]
    events replay --show ID | --cancel ID | --resume ID [--rate 10]

Without `--dry-run` the selection is frozen first (its count and id are
printed), then, once confirmed, run in the foreground by the machinery the
console and the admin API use (`shared/runs/paced.py`), a progress line
a second. Ctrl-C stops it resumable (`--resume ID`); `--cancel ID` ends a
replay wherever it runs. Needs `DATABASE_URL` and `AMQP_URL`.
"""

import asyncio
import sys

import click

from webhook_ingest.shared.archive import EventFilter, InvalidFilter
from webhook_ingest.shared.audit import Actor
from webhook_ingest.shared.errors import ConfigError, WebhookIngestError
from webhook_ingest.shared.replays import EventReplay, EventReplayJob, EventReplayStore
from webhook_ingest.shared.runs import DEFAULT_RATE, MAX_RATE, MIN_RATE, run
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources import Source, load_sources

from .common import ENV_HELP, fail, run_or_fail
from .dlq import _echo_json, _settings, confirm_channel, database
from .event_filters import cli_filter, filter_options, source_routes
from .terminal import echo


class NoSuchReplay(WebhookIngestError):
    pass


class NeedsTheSourcesFile(WebhookIngestError):
    """A selected source has ordering lanes, and the sources file (which says each event's lane) cannot be read."""


@click.command("replay", epilog=ENV_HELP)
@filter_options
@click.option("--dry-run", is_flag=True, help="only count the events a replay would take")
@click.option(
    "--rate",
    default=DEFAULT_RATE,
    show_default=True,
    type=click.FloatRange(MIN_RATE, MAX_RATE),
    help="events published per second",
)
@click.option("--yes", is_flag=True, help="do not ask to confirm")
@click.option("--show", "show_id", type=int, default=None, help="show replay ID's progress")
@click.option("--cancel", "cancel_id", type=int, default=None, help="cancel replay ID (what was published stays)")
@click.option("--resume", "resume_id", type=int, default=None, help="run replay ID's remaining events here")
@click.option("--json", "as_json", is_flag=True, help="one JSON object on stdout")
def replay(
    source,
    status,
    event_type,
    since,
    until,
    key,
    event_id,
    payload,
    dry_run,
    rate,
    yes,
    show_id,
    cancel_id,
    resume_id,
    as_json,
) -> None:
    """Replay every archived event a filter matches, each exactly once per replay."""
    settings = _settings()
    if show_id is not None or cancel_id is not None:
        replay_id = show_id if show_id is not None else cancel_id
        document = run_or_fail(_show_or_cancel(settings, replay_id, cancel=cancel_id is not None)).document()
        _echo_json(document) if as_json else echo(_describe(document))
        return
    if resume_id is not None:
        _run(settings, resume_id, rate, as_json)
        return
    try:
        where = cli_filter(source, status, event_type, since, until, key, event_id, payload)
    except InvalidFilter as exc:
        fail(f"invalid --{exc.field.replace('_', '-')}: {exc}")
    if dry_run:
        count = run_or_fail(_count(settings, where))
        _echo_json({"dry_run": True, "count": count}) if as_json else echo(f"{count} events would be replayed")
        return
    prepared = run_or_fail(_prepare(settings, where))
    if prepared.total == 0:
        run_or_fail(_show_or_cancel(settings, prepared.id, cancel=True))
        fail("no archived event matches: nothing to replay")
    echo(f"replay {prepared.id}: {prepared.total} events frozen", err=as_json)
    if not yes and not click.confirm(f"Replay these {prepared.total} events at {rate:g} per second?", err=as_json):
        run_or_fail(_show_or_cancel(settings, prepared.id, cancel=True))
        fail(f"replay {prepared.id} cancelled: nothing was published")
    _run(settings, prepared.id, rate, as_json)


def _run(settings: Settings, replay_id: int, rate: float, as_json: bool) -> None:
    try:
        finished = run_or_fail(_claim_and_run(settings, replay_id, rate, as_json))
    except KeyboardInterrupt:
        fail(f"replay {replay_id} stopped: resume it with --resume {replay_id}, or --cancel {replay_id}")
    if as_json:
        _echo_json(finished.document())
    else:
        echo(_describe(finished.document()))
    if finished.state != "done":
        sys.exit(1)


async def _count(settings: Settings, where: EventFilter) -> int:
    async with database(settings) as connection:
        return await EventReplayStore(connection).count(where, source_routes(settings))


async def _prepare(settings: Settings, where: EventFilter) -> EventReplay:
    async with database(settings) as connection:
        return await EventReplayStore(connection).prepare(where, Actor.cli(), source_routes(settings))


async def _show_or_cancel(settings: Settings, replay_id: int, cancel: bool) -> EventReplay:
    async with database(settings) as connection:
        store = EventReplayStore(connection)
        if cancel:
            await store.cancel(replay_id, Actor.cli())
        found = await store.get(replay_id)
    if found is None:
        raise NoSuchReplay(f"no replay {replay_id}")
    return found


async def _claim_and_run(settings: Settings, replay_id: int, rate: float, as_json: bool) -> EventReplay:
    async with database(settings) as connection, confirm_channel(settings) as channel:
        store = EventReplayStore(connection)
        sources = await _ordering_sources(settings, store, replay_id)
        claimed = await store.claim(replay_id, rate)
        if claimed is None:
            found = await store.get(replay_id)
            raise NoSuchReplay(
                f"no replay {replay_id}"
                if found is None
                else f"replay {replay_id} is {found.state}: not waiting to run"
            )
        job = EventReplayJob(
            claimed,
            Actor.cli(),
            store,
            lambda: channel,
            settings.namespace,
            progress=_Progress(replay_id),
            sources=sources,
        )
        await run(job)
        finished = await store.get(replay_id)
    assert finished is not None
    return finished


async def _ordering_sources(settings: Settings, store: EventReplayStore, replay_id: int) -> dict[str, Source]:
    """The sources file's sources: an ordered source's events go to their
    lanes, which the file says (docs/design.md, "Ordering keys"). Unreadable
    here (a secret it names unset in this shell): refused when a selected
    source has ordering lanes, rather than publishing its events unordered."""
    try:
        return load_sources(settings.sources_path)
    except ConfigError as exc:
        found = await store.get(replay_id)
        selected = found.filter.get("source") if found is not None else None
        ordered = await store.ordered_sources(None if selected is None else [selected])
        if ordered:
            raise NeedsTheSourcesFile(
                f"cannot read the sources file ({exc}), and {', '.join(ordered)} has ordering keys: which lane"
                f" each event goes to is the file's to say. Run it where the file can be read"
                f" (--resume {replay_id}), or --cancel {replay_id}"
            ) from exc
        echo(f"warning: {exc}; replaying without it (no selected source has ordering keys)", err=True)
        return {}


class _Progress:
    """A line on stderr at most once a second, and at the last item."""

    def __init__(self, replay_id: int):
        self._replay_id, self._shown_at = replay_id, 0.0

    def __call__(self, item: int, total: int, published: int, skipped: int) -> None:
        now = asyncio.get_running_loop().time()
        if now - self._shown_at >= 1.0 or item == total:
            self._shown_at = now
            echo(f"replay {self._replay_id}: {item} of {total} ({published} published, {skipped} skipped)", err=True)


def _describe(document: dict) -> str:
    lines = [
        f"replay {document['id']}: {document['state']}, {document['handled']} of {document['total']} handled"
        f" ({document['published']} published"
        + (f", {document['in_doubt']} of them in doubt" if document["in_doubt"] else "")
        + f", {document['skipped']} skipped)"
        + (f" at {document['rate']:g} per second" if document["rate"] else ""),
        f"filter: {document['filter'] or 'none: every archived event'}",
        f"asked by {document['created_by']} at {document['created_at']}",
    ]
    if document["error"]:
        lines.append(f"stopped: {document['error']}")
    if document["in_doubt"]:
        lines.append(
            "in doubt: its runner died while publishing the last event counted published; it may not have gone out"
        )
    return "\n".join(lines)
