"""The project's exception roots. Each docstring is the default message."""


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
    `Type` when the exception says nothing (a bare TimeoutError)."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def one_line(exc: BaseException) -> str:
    """The message alone on one line, or the type's name when it has none."""
    return " ".join(str(exc).split()) or type(exc).__name__
