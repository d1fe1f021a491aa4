"""What every command shares: the environment help and how to fail."""

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any, NoReturn

from webhook_ingest.shared.errors import ConfigError, WebhookIngestError
from webhook_ingest.shared.observability import tracing
from webhook_ingest.shared.settings import ENVIRONMENT_VARIABLES

from .terminal import echo

ENV_HELP = "\b\nEnvironment:\n" + "\n".join(
    f"  {name:<30} {meaning}"
    for name, meaning in (
        *ENVIRONMENT_VARIABLES,
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OpenTelemetry traces on, sent there (OTLP/HTTP); also the other OTEL_*"
            " variables (docs/operations.md, Tracing)",
        ),
    )
)


def fail(message: str) -> NoReturn:
    """One line on stderr, exit 2."""
    echo(f"error: {message}", err=True)
    sys.exit(2)


def traced(role: str) -> None:
    """OpenTelemetry traces for this process when an OTEL_* variable asks
    for them (shared/observability/tracing.py); a setting it cannot serve is one line and exit 2."""
    try:
        tracing.start(role)
    except ConfigError as exc:
        fail(str(exc))


def run_or_fail(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run the coroutine; the project's own errors become `fail`."""
    try:
        return asyncio.run(coroutine)
    except WebhookIngestError as exc:
        fail(str(exc))
