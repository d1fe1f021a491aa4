"""What aiohttp logs about requests it refused before any handler ran.

aiohttp answers a request it cannot parse (a control byte in a header, a
line too long, two Content-Lengths) with 400, and logs each one on
`aiohttp.server` at ERROR with a traceback: anyone could write an error into
the log with a few bytes and no budget to spend, and scanners on the
internet do it all day. Those records are dropped; everything else aiohttp
logs there (a handler that raised: a 500) is kept.
"""

import logging

from aiohttp.http_exceptions import HttpProcessingError


class _ClientProtocolErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, HttpProcessingError)


_DROPPED = _ClientProtocolErrors()


def drop_client_protocol_errors() -> None:
    """Once per process, however many apps it builds."""
    server_log = logging.getLogger("aiohttp.server")
    if _DROPPED not in server_log.filters:
        server_log.addFilter(_DROPPED)
