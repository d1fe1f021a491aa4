"""The project's exception roots. Each docstring is the default message."""


class WebhookIngestError(Exception):
    """webhook-ingest failed."""

    def __init__(self, message: str | None = None):
        super().__init__(message or self.__doc__)


class ConfigError(WebhookIngestError):
    """The configuration is invalid."""


class ServiceUnavailable(WebhookIngestError):
    """A backing service (RabbitMQ, Redis, Postgres) cannot be reached."""
