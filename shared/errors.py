"""The project's exception roots. Each docstring is the default message.

And how an error becomes text (`describe`, `one_line`, `redacted`): every
error text a log line, a stored failure, a viewer or a notification shows
is made here, with a URL's user, password and query redacted — `forward`'s
URL may carry credentials (`https://user:pass@host/hook?access_token=…`),
and aiohttp's errors repeat the URL they were given (docs/security.md,
"Secrets").
"""

import re


class WebhookIngestError(Exception):
    """webhook-ingest failed."""

    def __init__(self, message: str | None = None):
        super().__init__(message or self.__doc__)


class ConfigError(WebhookIngestError):
    """The configuration is invalid."""


class ServiceUnavailable(WebhookIngestError):
    """A backing service (RabbitMQ, Redis, Postgres) cannot be reached."""


class BrokerUnavailable(ServiceUnavailable):
    """RabbitMQ cannot be reached or does not confirm."""


def describe(exc: BaseException) -> str:
    """`Type: message` on one line, for a log field or an error message; just
    `Type` when the exception says nothing (a bare TimeoutError). Redacted."""
    text = one_line(exc)
    return f"{type(exc).__name__}: {text}" if str(exc).strip() else type(exc).__name__


def one_line(exc: BaseException) -> str:
    """The message alone on one line, or the type's name when it has none. Redacted."""
    return redacted(" ".join(str(exc).split())) or type(exc).__name__


# scheme://, then an optional user[:password]@ (no / ? # @ or space in it),
# the host and path, then an optional ?query (to a space, a quote, a bracket or #)
_URL = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/?#@]*@)?(?P<rest>[^\s?#'\"<>()\[\]]*)"
    r"(?P<query>\?[^\s#'\"<>()\[\]]*)?"
)


def redacted(text: str) -> str:
    """`text` with every URL's user, password and query replaced by `***`:
    `https://***@host/hook?***`. Host and path stay (they say where)."""
    if "://" not in text:
        return text
    return _URL.sub(_redacted_url, text)


def _redacted_url(url: re.Match[str]) -> str:
    userinfo = "***@" if url["userinfo"] else ""
    query = "?***" if url["query"] else ""
    return f"{url['head']}{userinfo}{url['rest']}{query}"
