"""`webhook-ingest dlq …` and `webhook-ingest prune`: on-call's commands (docs/reference.md §2).

They need only `DATABASE_URL` (and `AMQP_URL` for a replay), never the
sources' secrets, so they run from any machine that reaches the services.
"""

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import aio_pika
import asyncpg
import click
import orjson

from webhook_ingest.shared.audit import Actor
from webhook_ingest.shared.broker import amqp, topology
from webhook_ingest.shared.db import to_json
from webhook_ingest.shared.dead_letters import (
    STATUSES,
    DeadLetterNotFound,
    DeadLetterStore,
    Replayed,
    describe_error,
    detail,
    parse_id,
    summary,
)
from webhook_ingest.shared.errors import BrokerUnavailable, ConfigError, ServiceUnavailable, one_line
from webhook_ingest.shared.observability import configure_logging
from webhook_ingest.shared.service_errors import BROKER_ERRORS, POSTGRES_ERRORS
from webhook_ingest.shared.settings import Settings, load_settings
from webhook_ingest.workers.claim import CompletionStore

from .common import ENV_HELP, fail, run_or_fail, traced
from .terminal import echo

CONNECT_TIMEOUT = 10.0
_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class DatabaseUnavailable(ServiceUnavailable):
    """PostgreSQL cannot be reached."""


# "-1" is a (bad) id, not an unknown option: our one-line error, not click's usage text.
_IDS_MAY_LOOK_LIKE_OPTIONS = {"ignore_unknown_options": True}


@click.group(epilog=ENV_HELP)
def dlq() -> None:
    """Dead letters: what workers gave up on. List, show, replay, discard."""


@dlq.command("list", epilog=ENV_HELP)
@click.option("--source", default=None, help="only this source")
@click.option(
    "--status", default="dead", show_default=True, type=click.Choice([*STATUSES, "all"]), help="which dead letters"
)
@click.option("--limit", default=None, type=click.IntRange(min=1), help="at most this many (newest first)")
@click.option("--json", "as_json", is_flag=True, help="one JSON array on stdout")
def list_command(source: str | None, status: str, limit: int | None, as_json: bool) -> None:
    """Dead letters, newest first."""
    rows = run_or_fail(_with_store(_settings(), lambda store: store.newest_first(source, status, limit)))
    if as_json:
        _echo_json([summary(row) for row in rows])
    elif rows:
        echo(render_table(rows, datetime.now(UTC)))
    else:
        echo(f"no dead letters with status {status}" + (f" from source {source}" if source else ""))


@dlq.command("show", epilog=ENV_HELP, context_settings=_IDS_MAY_LOOK_LIKE_OPTIONS)
@click.argument("dead_letter_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="one JSON object on stdout")
def show_command(dead_letter_id: str, as_json: bool) -> None:
    """One dead letter: payload, headers, attempts, every error."""
    [parsed_id] = parse_ids([dead_letter_id])
    row = run_or_fail(_with_store(_settings(), lambda store: _get_existing(store, parsed_id)))
    if as_json:
        _echo_json(detail(row))
    else:
        echo(render_detail(detail(row)))


@dlq.command("replay", epilog=ENV_HELP, context_settings=_IDS_MAY_LOOK_LIKE_OPTIONS)
@click.argument("dead_letter_ids", metavar="[ID]...", nargs=-1)
@click.option("--all", "all_", is_flag=True, help="every dead letter with status dead")
@click.option("--source", default=None, help="with --all: only this source")
def replay_command(dead_letter_ids: tuple[str, ...], all_: bool, source: str | None) -> None:
    """Put dead letters back on the main queue with a fresh attempt budget."""
    if bool(dead_letter_ids) == all_:
        fail("give dead-letter ids or --all, not both")
    if source and not all_:
        fail("--source goes with --all")
    ids = parse_ids(dead_letter_ids)
    settings = _settings()
    traced("cli")  # each replay a trace of its own
    done = run_or_fail(_replay(settings, ids, all_, source))
    echo(f"replayed {len(done.replayed)}: {', '.join(map(str, done.replayed))}" if done.replayed else "replayed 0")
    if done.skipped:
        echo(
            f"skipped {len(done.skipped)}, changed meanwhile (replayed or discarded by someone else): "
            f"{', '.join(map(str, done.skipped))}"
        )


@dlq.command("discard", epilog=ENV_HELP, context_settings=_IDS_MAY_LOOK_LIKE_OPTIONS)
@click.argument("dead_letter_ids", metavar="ID...", nargs=-1, required=True)
def discard_command(dead_letter_ids: tuple[str, ...]) -> None:
    """Mark dead letters discarded (kept for audit); all or nothing."""
    ids = parse_ids(dead_letter_ids)
    discarded = run_or_fail(_with_store(_settings(), lambda store: store.discard(ids, Actor.cli())))
    echo(f"discarded {len(discarded)}: {', '.join(map(str, discarded))}")


@click.command(epilog=ENV_HELP)
@click.option(
    "--older-than", "older_than", default="30d", show_default=True, help="retention window: 30d, 12h, 90m, 3600s"
)
def prune(older_than: str) -> None:
    """Delete completion records past the retention window.

    A redelivery of an event whose record was pruned is processed again.
    Dead letters are kept.
    """
    window = parse_duration(older_than)
    pruned = run_or_fail(_prune(_settings(), window))
    echo(f"pruned {pruned} completion records older than {older_than}")


# -- arguments -------------------------------------------------------------------


def parse_ids(values) -> list[int]:
    ids = [parse_id(value) for value in values]
    if None in ids:
        bad = next(value for value, parsed in zip(values, ids) if parsed is None)
        fail(f"invalid dead-letter id {bad!r}: ids are positive integers")
    return list(dict.fromkeys(id_ for id_ in ids if id_ is not None))


def parse_duration(text: str) -> timedelta:
    match = _DURATION.match(text.strip())
    if not match or int(match[1]) == 0:
        fail(f"invalid duration {text!r}: a positive number followed by s, m, h or d (e.g. 30d)")
    return timedelta(seconds=int(match[1]) * _UNIT_SECONDS[match[2]])


def _settings() -> Settings:
    try:
        settings = load_settings()
    except ConfigError as exc:
        fail(str(exc))
    configure_logging(settings.log_format)
    topology.set_event_queues(settings.event_queues)
    return settings


# -- services --------------------------------------------------------------------


async def _prune(settings: Settings, window: timedelta) -> int:
    async with database(settings) as connection:
        return await CompletionStore(connection).prune(window)


async def _with_store(settings: Settings, use: Callable[[DeadLetterStore], Awaitable[Any]]) -> Any:
    async with database(settings) as connection:
        return await use(DeadLetterStore(connection))


async def _get_existing(store: DeadLetterStore, dead_letter_id: int) -> dict:
    row = await store.get(dead_letter_id)
    if row is None:
        raise DeadLetterNotFound([dead_letter_id])
    return row


@contextlib.asynccontextmanager
async def database(settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    """One connection; Postgres failures become one readable line."""
    where = settings.masked()["database_url"]
    try:
        connection = await asyncpg.connect(settings.database_url, timeout=CONNECT_TIMEOUT)
    except POSTGRES_ERRORS as exc:
        raise DatabaseUnavailable(f"cannot reach PostgreSQL at {where}: {one_line(exc)}") from exc
    try:
        yield connection
    except asyncpg.UndefinedTableError as exc:
        raise DatabaseUnavailable(f"{one_line(exc)} at {where}: run `webhook-ingest migrate` first") from exc
    except POSTGRES_ERRORS as exc:
        raise DatabaseUnavailable(f"PostgreSQL at {where} failed: {one_line(exc)}") from exc
    finally:
        with contextlib.suppress(Exception):
            await connection.close(timeout=5)


@contextlib.asynccontextmanager
async def confirm_channel(settings: Settings) -> AsyncIterator[aio_pika.abc.AbstractChannel]:
    """A confirm-mode channel, the events queue known to exist."""
    where = settings.masked()["amqp_url"]
    try:
        connection = await amqp.connect(
            settings.amqp_url, timeout=CONNECT_TIMEOUT, client_properties={"connection_name": "dlq-replay"}
        )
    except BROKER_ERRORS as exc:
        raise BrokerUnavailable(f"cannot reach RabbitMQ at {where}: {one_line(exc)}") from exc
    async with connection:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):  # a broker that hangs once connected
                await topology.ensure_events_queue(connection, settings.namespace, settings.delivery_limit)
                channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        except BROKER_ERRORS as exc:
            raise BrokerUnavailable(f"RabbitMQ at {where}: {one_line(exc)}") from exc
        yield channel


async def _replay(settings: Settings, ids: list[int], all_: bool, source: str | None) -> Replayed:
    async with database(settings) as connection, confirm_channel(settings) as channel:
        return await DeadLetterStore(connection).replay(
            channel, settings.namespace, ids=ids, all_=all_, source=source, actor=Actor.cli()
        )


# -- output ----------------------------------------------------------------------


def _echo_json(document) -> None:
    echo(to_json(document).decode())


def render_table(rows: list[dict], now: datetime) -> str:
    header = ("ID", "STATUS", "SOURCE", "KEY", "ATTEMPTS", "AGE", "LAST ERROR")
    lines = [
        (
            str(row["id"]),
            row["status"],
            row["source"],
            trimmed(row["key"], 48),
            str(row["attempts"]),
            age(now - row["created_at"]),
            trimmed(describe_error(row["last_error"]) or "-", 60),
        )
        for row in rows
    ]
    widths = [max(len(line[column]) for line in [header, *lines]) for column in range(len(header) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths)) + "  " + line[-1] for line in [header, *lines]
    )


def render_detail(document: dict) -> str:
    fields = (
        "id",
        "status",
        "source",
        "route",
        "key",
        "event_id",
        "attempts",
        "received_at",
        "created_at",
        "updated_at",
    )
    lines = [f"{name + ':':<13} {document[name]}" for name in fields if name in document]  # route: a route's run
    lines += ["", "headers:", _indented_json(document["headers"]), "", "payload:"]
    payload = document["payload"]
    lines.append(_indented_json(payload) if payload is not None else "  " + document.get("body", ""))
    lines += ["", f"errors ({len(document['errors'])}):"]
    for error in document["errors"]:
        lines.append(f"  attempt {error['attempt']} at {error['at']}: {describe_error(error)}")
        lines += ["    " + line for line in (error.get("traceback") or "").rstrip().splitlines()]
    return "\n".join(lines)


def _indented_json(value) -> str:
    try:
        text = orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
    except orjson.JSONEncodeError:
        text = to_json(value).decode()
    return "\n".join("  " + line for line in text.splitlines())


def trimmed(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def age(elapsed: timedelta) -> str:
    """3m, 2h, 4d: the largest unit that is at least one."""
    seconds = max(int(elapsed.total_seconds()), 0)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
