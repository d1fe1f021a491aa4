"""`webhook-ingest`: every command of docs/reference.md §2."""

import asyncio
import gc
import importlib
import sys
from typing import ClassVar

import click

from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.errors import ConfigError
from webhook_ingest.shared.observability import configure_logging, get_logger
from webhook_ingest.shared.settings import Settings, load_settings
from webhook_ingest.shared.sources import Source, load_sources

from . import layout, ports
from .common import ENV_HELP, fail, traced
from .terminal import echo

log = get_logger("webhook_ingest")
POOLER_CHECK_SECONDS = 5.0  # the ingress's look for a transaction pooler, at start
SEND_TEST_URL = "http://127.0.0.1:8080"  # send-test's default: `run`'s defaults


class _Processes(click.ParamType):
    """A process count: a positive integer, or `auto` (one per core)."""

    name = "N|auto"

    def convert(self, value, param, ctx):
        if value == "auto" or (str(value).isdigit() and int(value) >= 1):
            return str(value)
        self.fail(f"{value!r} is neither a positive integer nor auto", param, ctx)


PROCESSES = _Processes()


def configured() -> tuple[Settings, dict[str, Source]]:
    """Settings and validated sources, or one clear line and exit 2."""
    try:
        settings = load_settings()
        configure_logging(settings.log_format)
        topology.set_event_queues(settings.event_queues)
        return settings, load_sources(settings.sources_path)
    except ConfigError as exc:
        fail(str(exc))


def install_uvloop() -> None:
    try:
        import uvloop
    except ImportError:
        pass
    else:
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    # Everything imported and configured so far lives as long as the
    # process: out of the cyclic GC's reach, a full collection scans only
    # what requests and messages allocate, instead of stalling the event
    # loop 20-45 ms (measured in the ingress at 1,000 req/s).
    gc.freeze()


class _Commands(click.Group):
    """The top-level group. On-call's commands load their module when asked
    for: the others start without importing it (aio-pika, asyncpg and the
    dead-letter store for `migrate` and `--help`, ~0.15 s a start)."""

    ON_CALL: ClassVar[dict[str, str]] = {
        "dlq": "cli.dlq",
        "prune": "cli.dlq",
        "incidents": "cli.incidents",  # command: module of webhook_ingest
        "sources": "cli.sources",
        "events": "cli.events",
        "ordering": "cli.ordering",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.ON_CALL})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.ON_CALL:
            on_call = importlib.import_module(f"webhook_ingest.{self.ON_CALL[cmd_name]}")
            command: click.Command = getattr(on_call, cmd_name)
            return command
        return super().get_command(ctx, cmd_name)


@click.group(cls=_Commands, epilog=ENV_HELP, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Self-hosted webhook ingestion: verified, durably queued, processed exactly once."""


@main.command(epilog=ENV_HELP)
def migrate() -> None:
    """Create the database if missing and apply schema migrations (idempotent)."""
    try:
        settings = load_settings()  # not the sources file: migrating does not need it
    except ConfigError as exc:
        fail(str(exc))
    configure_logging(settings.log_format)
    _migrate_or_fail(settings)


def _migrate_or_fail(settings: Settings) -> None:
    """Migrate and say what was applied, or one line on stderr and exit 2."""
    import asyncpg

    from webhook_ingest.shared.errors import WebhookIngestError, describe, one_line

    from .migrate import migrate as run_migrations

    where = settings.masked()["database_url"]
    try:
        applied = asyncio.run(run_migrations(settings.database_url))
    except WebhookIngestError as exc:
        fail(str(exc))
    except (OSError, asyncio.TimeoutError) as exc:
        fail(f"cannot reach PostgreSQL at {where}: {one_line(exc)}")
    except asyncpg.PostgresError as exc:
        fail(f"PostgreSQL at {where}: {describe(exc)}")
    echo(f"migrations applied: {', '.join(applied)}" if applied else "database is up to date")


@main.command(epilog=ENV_HELP)
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8080, show_default=True, type=int, help="port to listen on")
@click.option("--reuse-port", is_flag=True, help="let several ingress processes share the port (SO_REUSEPORT)")
@click.option(
    "--processes",
    default="1",
    show_default=True,
    type=PROCESSES,
    help="ingress processes sharing the port; auto: one per core (at most 4)",
)
def ingress(host: str, port: int, reuse_port: bool, processes: str) -> None:
    """Serve the webhook ingress."""
    from aiohttp import web

    from webhook_ingest.ingress.app import create_app, stopping_once

    settings, sources = configured()
    if (count := layout.ingress_processes(processes)) > 1:
        _port_free_or_fail(host, port)
        _supervise(layout.ingress_commands(host, port, count))
        return
    try:
        listening = ports.listening_sockets(host, port, reuse_port)
    except ports.PortUnavailable as exc:
        fail(str(exc))
    _no_transaction_pooler_or_fail(settings)
    traced("ingress")  # before the app: its request middleware
    install_uvloop()
    log.info("ingress_starting", host=host, port=port, sources=sorted(sources), **settings.masked())
    web.run_app(
        stopping_once(create_app(settings, sources)),
        sock=listening,
        handle_signals=False,
        shutdown_timeout=layout.INGRESS_GRACE,
        print=None,
        access_log=None,
    )


def _no_transaction_pooler_or_fail(settings: Settings) -> None:
    """Refused at start behind transaction pooling (shared/db/pooler.py); an
    ingress whose Postgres is away starts all the same (it serves through
    the broker) and cannot tell."""
    import asyncpg

    from webhook_ingest.shared.db import refuse_transaction_pooling
    from webhook_ingest.shared.errors import describe

    try:
        asyncio.run(asyncio.wait_for(refuse_transaction_pooling(settings.database_url), POOLER_CHECK_SECONDS))
    except ConfigError as exc:
        fail(str(exc))
    except (OSError, asyncio.TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        log.warning("pooler_not_checked", error=describe(exc))


def _port_free_or_fail(host: str, port: int) -> None:
    """Before the processes that share the port start (docs/design.md, "One port, one deployment")."""
    try:
        ports.check_free(host, port)
    except ports.PortUnavailable as exc:
        fail(str(exc))


@main.command(name="send-test", epilog=ENV_HELP)
@click.argument("source_name", metavar="SOURCE")
@click.option("--url", default=SEND_TEST_URL, show_default=True, help="ingress base URL")
@click.option(
    "--duplicates", default=0, show_default=True, type=click.IntRange(min=0), help="identical copies sent alongside"
)
def send_test_command(source_name: str, url: str, duplicates: int) -> None:
    """Sign a sample event with SOURCE's secret and send it; one line per request."""
    import aiohttp

    from .send_test import send_test

    _, sources = configured()
    if source_name not in sources:
        fail(f"unknown source {source_name!r} (known: {', '.join(sorted(sources))})")
    try:
        results = asyncio.run(send_test(sources[source_name], url, duplicates))
    except ConfigError as exc:  # a source send-test cannot sign for
        fail(str(exc))
    except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
        fail(f"cannot reach the ingress at {url}: {exc}")
    for status, body in results:
        echo(f"{status} {body}")
    refused = [status for status, _ in results if not 200 <= status < 300]
    if refused:
        hint = f" (no source {source_name!r} there: is it this deployment's ingress?)" if 404 in refused else ""
        fail(
            f"{len(refused)} of {len(results)} requests not accepted by {url}:"
            f" HTTP {', '.join(map(str, sorted(set(refused))))}{hint}"
        )


@main.command(epilog=ENV_HELP)
@click.option(
    "--concurrency",
    default=layout.CONCURRENCY,
    show_default=True,
    type=click.IntRange(min=1),
    help="messages in flight",
)
@click.option("--metrics-port", type=int, default=None, help="serve /metrics, /healthz, /readyz on this port")
@click.option(
    "--grace-seconds",
    default=layout.WORKER_GRACE,
    show_default=True,
    type=float,
    help="SIGTERM: time for running handlers",
)
def worker(concurrency: int, metrics_port: int | None, grace_seconds: float) -> None:
    """Run one worker process (start as many as you like, anywhere)."""
    settings, sources = configured()
    _validate_handlers(sources)
    traced("worker")
    install_uvloop()
    log.info("worker_starting", concurrency=concurrency, sources=sorted(sources), **settings.masked())
    from webhook_ingest.shared.db import SchemaBehind, TransactionPooler

    try:
        asyncio.run(_run_worker(settings, sources, concurrency, metrics_port, grace_seconds))
    except (SchemaBehind, TransactionPooler) as exc:  # before any message was taken
        fail(str(exc))
    log.info("worker_stopped")


async def _run_worker(settings, sources, concurrency, metrics_port, grace_seconds) -> None:
    import contextlib

    from webhook_ingest.workers.worker import Worker, install_signal_handlers

    worker_process = Worker(settings, sources, concurrency, grace_seconds)
    install_signal_handlers(worker_process)
    async with contextlib.AsyncExitStack() as stack:
        if metrics_port is not None:
            from webhook_ingest.workers.health import serve_health  # aiohttp's server: only for this port

            await stack.enter_async_context(serve_health(worker_process, metrics_port))
        await worker_process.run()


def _validate_handlers(sources: dict[str, Source]) -> None:
    """Run where handlers run (`worker`, and `run` before it starts any):
    the ingress never imports handler code."""
    from webhook_ingest.workers.handlers import load_handlers

    try:
        load_handlers(sources)
    except ConfigError as exc:
        fail(str(exc))


@main.command(epilog=ENV_HELP)
@click.option("--host", default="127.0.0.1", show_default=True, help="address to listen on")
@click.option("--port", default=8080, show_default=True, type=int, help="port to listen on")
@click.option(
    "--ingress-processes",
    default="auto",
    show_default=True,
    type=PROCESSES,
    help="ingress processes sharing the port; auto: one per core (at most 4)",
)
@click.option(
    "--workers",
    "worker_count",
    default=layout.WORKERS,
    show_default=True,
    type=click.IntRange(min=1),
    help="worker processes",
)
@click.option(
    "--concurrency",
    default=layout.CONCURRENCY,
    show_default=True,
    type=click.IntRange(min=1),
    help="messages in flight per worker",
)
@click.option(
    "--worker-metrics-port",
    type=int,
    default=None,
    help="worker n serves /metrics, /healthz, /readyz on this port + n - 1",
)
def run(
    host: str, port: int, ingress_processes: str, worker_count: int, concurrency: int, worker_metrics_port: int | None
) -> None:
    """Migrate, then run the ingress and N workers under one supervisor.

    The defaults are the configuration `make bench` measured fastest
    (docs/performance.md); the options override it."""
    from .preflight import service_problems

    settings, sources = configured()
    _port_free_or_fail(host, port)
    _validate_handlers(sources)
    problems = asyncio.run(service_problems(settings))
    if problems:
        for problem in problems:
            echo(f"error: {problem}", err=True)
        sys.exit(1)
    _migrate_or_fail(settings)
    ingress_count = layout.ingress_processes(ingress_processes)
    echo(
        f"ingress on http://{host}:{port}  ({ingress_count} ingress processes, {worker_count} workers × "
        f"{concurrency} in flight; Ctrl-C stops all)"
    )
    echo(f"try it:  {send_test_line(next(iter(sources)), host, port)}")
    echo(console_line(settings, host, port))
    _supervise(
        {
            **layout.ingress_commands(host, port, ingress_count),
            **layout.worker_commands(worker_count, concurrency, worker_metrics_port),
        }
    )


def _supervise(commands: dict[str, list[str]]) -> None:
    from .supervisor import Supervisor

    install_uvloop()
    asyncio.run(Supervisor(commands).run())


def send_test_line(source_name: str, host: str, port: int) -> str:
    """The send-test command that reaches this ingress (`--url` unless it is send-test's default)."""
    url = f"http://{_client_host(host)}:{port}"
    return f"webhook-ingest send-test {source_name}" + ("" if url == SEND_TEST_URL else f" --url {url}")


def _client_host(host: str) -> str:
    """Where a client on this machine reaches a server listening on `host`."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def console_line(settings: Settings, host: str, port: int) -> str:
    """Where on-call reviews dead letters, or how to turn the console on."""
    if settings.admin_token:
        return f"console: http://{host}:{port}/console/  (sign in with WEBHOOK_INGEST_ADMIN_TOKEN)"
    return "console: off (set WEBHOOK_INGEST_ADMIN_TOKEN to a long random token to turn it on)"
