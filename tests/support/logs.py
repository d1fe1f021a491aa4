"""Capturing what our modules log, whatever ran before in the process."""

import contextlib
import logging
import sys
from collections.abc import Iterator, Sequence

import structlog
from structlog._config import BoundLoggerLazyProxy
from structlog.testing import capture_logs
from structlog.typing import Processor


@contextlib.contextmanager
def captured_logs(processors: Sequence[Processor] = ()) -> Iterator[list[dict]]:
    """capture_logs, for our modules' loggers too. Each is structlog's lazy
    proxy, which cache_logger_on_first_use binds for good on its first line
    to the processors configured then (an earlier test's, or an earlier
    capture's, whose list capture_logs does not touch): made lazy again,
    and without a level an earlier configure_logging may have set. Without
    it a test capturing a line our module had already logged in this
    process (another test, earlier in the same xdist worker) saw none."""
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("webhook_ingest."):
            for value in list(vars(module).values()):
                if isinstance(value, BoundLoggerLazyProxy):
                    vars(value).pop("bind", None)
    configured = structlog.get_config()
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG)
    )  # an earlier level's filter off
    try:
        with capture_logs(processors=list(processors)) as logs:
            yield logs
    finally:
        structlog.configure(**configured)
