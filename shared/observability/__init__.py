"""webhook_ingest.shared.observability: what each of its modules holds.

- logging       One `configure_logging()` for every process.
- loggers       `get_logger()`, alone: below logging and tracing_otel, which both use it.
- tracing       OpenTelemetry traces, opt-in through the standard `OTEL_*` variables (docs/operations.md …
- tracing_otel  Tracing on: the OpenTelemetry SDK and instrumentations behind `shared/observability/tracing.py` …
- metrics       Every Prometheus metric the pipeline exports, in one place.
"""

from .loggers import get_logger
from .logging import configure_logging

__all__ = ["configure_logging", "get_logger", "metrics", "tracing"]
