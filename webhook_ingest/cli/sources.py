"""`webhook-ingest sources …`: pause and resume a source (docs/reference.md §8.3).

A paused source's events are accepted and parked, not processed; resuming
processes them, oldest first. Needs `DATABASE_URL` (the state) and, for how
many wait, `AMQP_URL`; the sources file, when set, to refuse a name it
does not hold.
"""

import asyncio

import click

from webhook_ingest.shared.audit import Actor
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.errors import ConfigError
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources import PauseStore, load_sources

from .common import ENV_HELP, fail, run_or_fail
from .dlq import _settings, database
from .terminal import echo


@click.group(epilog=ENV_HELP)
def sources() -> None:
    """Pause and resume sources: list, pause, resume."""


@sources.command("list", epilog=ENV_HELP)
def list_command() -> None:
    """Each source, paused or not, and how many of its events wait parked."""
    settings = _settings()
    names = _source_names(settings)
    paused = run_or_fail(_paused(settings))
    waiting = asyncio.run(parked_counts(settings, sorted({*names, *paused})))
    for name in sorted({*names, *paused}):
        state = (
            f"paused by {paused[name]['paused_by']} at {paused[name]['paused_at'].isoformat()}"
            if name in paused
            else "running"
        )
        count = waiting.get(name)
        echo(f"{name}  {state}  waiting: {'n/a' if count is None else count}")


@sources.command("pause", epilog=ENV_HELP)
@click.argument("name")
def pause_command(name: str) -> None:
    """Accept NAME's events but keep them, unprocessed, until it is resumed."""
    _change(name, pause=True)


@sources.command("resume", epilog=ENV_HELP)
@click.argument("name")
def resume_command(name: str) -> None:
    """Process NAME's events again, those kept while paused first."""
    _change(name, pause=False)


def _change(name: str, pause: bool) -> None:
    settings = _settings()
    if name not in _source_names(settings):
        fail(f"no source named {name!r} in the sources file")
    changed = run_or_fail(_pause_or_resume(settings, name, pause))
    verb = "paused" if pause else "resumed"
    unchanged = "already paused" if pause else "not paused"
    echo(f"source {name} {verb}" if changed else f"source {name} was {unchanged}")


def _source_names(settings: Settings) -> set[str]:
    try:
        return set(load_sources(settings.sources_path))
    except ConfigError as exc:
        fail(str(exc))


async def _paused(settings: Settings) -> dict[str, dict]:
    async with database(settings) as connection:
        return await PauseStore(connection).paused()


async def _pause_or_resume(settings: Settings, name: str, pause: bool) -> bool:
    async with database(settings) as connection:
        store = PauseStore(connection)
        return await (store.pause(name, Actor.cli()) if pause else store.resume(name, Actor.cli()))


async def parked_counts(settings: Settings, names: list[str]) -> dict[str, int | None]:
    """How many events each source has parked; None when the broker cannot
    tell (away, or no worker declared the queue yet)."""
    queues = {topology.paused_queue(settings.namespace, name): name for name in names}
    depths = await topology.queue_depths(settings.amqp_url, list(queues), "sources-list")
    return {queues[queue]: depth for queue, depth in depths}
