"""Process configuration from the environment (docs/reference.md §3).

Every variable has a default that works against services on loopback, so a
first run needs no configuration at all.
"""

from functools import cached_property
from ipaddress import IPv4Network, IPv6Network, ip_network

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .errors import ConfigError

ENVIRONMENT_VARIABLES = (
    ("AMQP_URL", "RabbitMQ URL; the nodes of a cluster comma-separated, tried in turn"),
    ("REDIS_URLS", "comma-separated independent Redis masters (Redlock quorum over all)"),
    ("DATABASE_URL", "Postgres URL; `migrate` creates the database if missing"),
    ("WEBHOOK_INGEST_NAMESPACE", "prefix of every queue and Redis key"),
    ("WEBHOOK_INGEST_SOURCES", "path of the sources TOML file (unset: built-in demo source)"),
    (
        "WEBHOOK_INGEST_ADMIN_TOKEN",
        "operator token of the admin HTTP API and the console, 32 characters or more (unset: both disabled)",
    ),
    ("WEBHOOK_INGEST_VIEWER_TOKEN", "read-only token of the admin HTTP API and the console, 32 or more (unset: none)"),
    ("WEBHOOK_INGEST_CONSOLE_SESSION_SECONDS", "how long a console sign-in lasts"),
    ("WEBHOOK_INGEST_INCIDENT_QUIET_MINUTES", "minutes without a new failure after which an incident resolves itself"),
    ("WEBHOOK_INGEST_NOTIFY_SLACK_URL", "Slack incoming-webhook URL told when an incident opens, reopens or resolves"),
    ("WEBHOOK_INGEST_NOTIFY_WEBHOOK_URL", "URL sent a JSON message, signed as Standard Webhooks, on the same changes"),
    ("WEBHOOK_INGEST_NOTIFY_WEBHOOK_SECRET", "its Standard Webhooks secret (`whsec_…`); required with the URL"),
    ("WEBHOOK_INGEST_DELIVERY_LIMIT", "deliveries before a message that kills its worker is dead-lettered"),
    (
        "WEBHOOK_INGEST_EVENT_QUEUES",
        "partitions of the events queue, an event in its key's (1: the one `NS.events`; N: `NS.events.0`"
        " … `NS.events.{N-1}`, each worker consuming all); every process of a deployment the same",
    ),
    (
        "WEBHOOK_INGEST_LOCK_TTL",
        "TTL in seconds of the Redis processing lock and the Postgres lease of a key"
        " (renewed every third of it while a handler runs; a killed worker's keys are free"
        " after it)",
    ),
    (
        "WEBHOOK_INGEST_HEARTBEAT_SECONDS",
        "seconds between a worker's heartbeats (its row on the console's overview); silent after three missed",
    ),
    ("WEBHOOK_INGEST_DONE_TTL", "seconds Redis remembers a completed key (Postgres remembers until pruned)"),
    (
        "WEBHOOK_INGEST_REPLAY_WINDOW",
        "seconds Redis binds signed content to the first id it came with under each type,"
        " for the schemes that sign neither (reference §5): the same content under"
        " another id with a type it came with, or the same id with another type, is a"
        " duplicate",
    ),
    (
        "WEBHOOK_INGEST_TRUSTED_PROXIES",
        "comma-separated CIDRs of the proxies whose forwarding header sets the client address (unset: none)",
    ),
    (
        "WEBHOOK_INGEST_CLIENT_ADDRESS_HEADER",
        "the one forwarding header those proxies manage: `X-Forwarded-For` or `Forwarded`; the other is never read",
    ),
    (
        "WEBHOOK_INGEST_METRICS_ALLOWED_IPS",
        "comma-separated CIDRs of the clients `/metrics` answers; others get 403 (loopback and the private networks)",
    ),
    (
        "WEBHOOK_INGEST_HEADER_TIMEOUT",
        "seconds a connection has to send a request's headers (also the keep-alive idle limit)",
    ),
    ("WEBHOOK_INGEST_BODY_TIMEOUT", "seconds a request has to send its whole body"),
    (
        "WEBHOOK_INGEST_MAX_CONCURRENT_REQUESTS",
        "webhook requests one ingress process works on at once, counted once"
        " their headers are vetted; beyond, 503 at once",
    ),
    (
        "WEBHOOK_INGEST_MAX_BODIES_PER_CLIENT",
        "webhook requests of one client address whose body is still arriving"
        " a second after it began to be read, per ingress process; beyond, 429"
        " to that client",
    ),
    (
        "WEBHOOK_INGEST_WORKER_CONNECTIONS",
        "Postgres connections one worker process opens at most, its four pools"
        ' together (docs/operations.md, "Postgres connections"); at least 5',
    ),
    (
        "WEBHOOK_INGEST_INGRESS_CONNECTIONS",
        "Postgres connections one ingress process opens at most (the outbox,"
        " its relay, the admin API and the console); at least 3",
    ),
    ("LOG_FORMAT", "json or console (default: console on a TTY, else json)"),
)

# 32 characters of a random token_urlsafe: 192 bits; of hex: 128.
MIN_TOKEN_CHARACTERS = 32

# Where Prometheus scrapes from in compose and Kubernetes; never the internet.
PRIVATE_NETWORKS = "127.0.0.0/8, ::1/128, 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, fc00::/7"

# A stock Postgres (max_connections 100, 3 for superusers) serves 10 workers
# and 2 ingress processes at these, with 7 sessions left for one-off
# commands (docs/operations.md, "Postgres connections").
WORKER_CONNECTIONS, MIN_WORKER_CONNECTIONS = 8, 5
INGRESS_CONNECTIONS, MIN_INGRESS_CONNECTIONS = 5, 3

# The headers a proxy can manage (ingress/client_address.py reads exactly one).
CLIENT_ADDRESS_HEADERS = ("X-Forwarded-For", "Forwarded")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore", frozen=True)

    amqp_url: str = Field("amqp://guest:guest@127.0.0.1:5672/", alias="AMQP_URL")
    redis_urls_csv: str = Field("redis://127.0.0.1:6379/0", alias="REDIS_URLS")
    database_url: str = Field("postgresql://postgres@127.0.0.1:5432/webhooks", alias="DATABASE_URL")
    namespace: str = Field("webhooks", alias="WEBHOOK_INGEST_NAMESPACE", pattern=r"^[A-Za-z0-9_\-]+$")
    sources_path: str | None = Field(None, alias="WEBHOOK_INGEST_SOURCES")
    admin_token: str | None = Field(None, alias="WEBHOOK_INGEST_ADMIN_TOKEN")
    viewer_token: str | None = Field(None, alias="WEBHOOK_INGEST_VIEWER_TOKEN")
    console_session_seconds: int = Field(28800, alias="WEBHOOK_INGEST_CONSOLE_SESSION_SECONDS", ge=1)
    notify_slack_url: str | None = Field(None, alias="WEBHOOK_INGEST_NOTIFY_SLACK_URL")
    notify_webhook_url: str | None = Field(None, alias="WEBHOOK_INGEST_NOTIFY_WEBHOOK_URL")
    notify_webhook_secret: str | None = Field(None, alias="WEBHOOK_INGEST_NOTIFY_WEBHOOK_SECRET")
    incident_quiet_minutes: float = Field(30.0, alias="WEBHOOK_INGEST_INCIDENT_QUIET_MINUTES", gt=0)
    delivery_limit: int = Field(20, alias="WEBHOOK_INGEST_DELIVERY_LIMIT", ge=1)
    event_queues: int = Field(1, alias="WEBHOOK_INGEST_EVENT_QUEUES", ge=1, le=64)
    lock_ttl: float = Field(3.0, alias="WEBHOOK_INGEST_LOCK_TTL", gt=0)
    heartbeat_seconds: float = Field(5.0, alias="WEBHOOK_INGEST_HEARTBEAT_SECONDS", gt=0)
    done_ttl: int = Field(86400, alias="WEBHOOK_INGEST_DONE_TTL", ge=1)
    replay_window: int = Field(604800, alias="WEBHOOK_INGEST_REPLAY_WINDOW", ge=1)
    worker_connections: int = Field(WORKER_CONNECTIONS, alias="WEBHOOK_INGEST_WORKER_CONNECTIONS")
    ingress_connections: int = Field(INGRESS_CONNECTIONS, alias="WEBHOOK_INGEST_INGRESS_CONNECTIONS")
    log_format: str | None = Field(None, alias="LOG_FORMAT", pattern=r"^(json|console)$")
    trusted_proxies_csv: str = Field("", alias="WEBHOOK_INGEST_TRUSTED_PROXIES")
    client_address_header: str = Field("X-Forwarded-For", alias="WEBHOOK_INGEST_CLIENT_ADDRESS_HEADER")
    metrics_allowed_ips_csv: str = Field(PRIVATE_NETWORKS, alias="WEBHOOK_INGEST_METRICS_ALLOWED_IPS")
    header_timeout: float = Field(60.0, alias="WEBHOOK_INGEST_HEADER_TIMEOUT", gt=0)
    body_timeout: float = Field(60.0, alias="WEBHOOK_INGEST_BODY_TIMEOUT", gt=0)
    max_concurrent_requests: int = Field(256, alias="WEBHOOK_INGEST_MAX_CONCURRENT_REQUESTS", ge=1)
    max_bodies_per_client: int = Field(32, alias="WEBHOOK_INGEST_MAX_BODIES_PER_CLIENT", ge=1)

    @field_validator(
        "sources_path",
        "admin_token",
        "viewer_token",
        "log_format",
        "notify_slack_url",
        "notify_webhook_url",
        "notify_webhook_secret",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # Compose and Kubernetes often set a variable to "" to mean "not set".
        return value or None

    @field_validator("admin_token", "viewer_token")
    @classmethod
    def _long_enough(cls, value: str | None) -> str | None:
        # The token is the console's and the admin API's only credential, and
        # a short one falls to guessing (docs/security.md, "Tokens").
        if value is not None and len(value) < MIN_TOKEN_CHARACTERS:
            raise ValueError(
                f"is {len(value)} characters; it must be at least {MIN_TOKEN_CHARACTERS} characters"
                " of a random value, e.g. python3 -c 'import secrets; print(secrets.token_urlsafe(32))'"
            )
        return value

    @model_validator(mode="after")
    def _webhook_needs_its_secret(self) -> "Settings":
        if bool(self.notify_webhook_url) != bool(self.notify_webhook_secret):
            raise ValueError(
                "WEBHOOK_INGEST_NOTIFY_WEBHOOK_URL and WEBHOOK_INGEST_NOTIFY_WEBHOOK_SECRET go together:"
                " the receiver verifies each message with the secret"
            )
        return self

    @field_validator("worker_connections")
    @classmethod
    def _worker_pools_fit(cls, value: int) -> int:
        if value < MIN_WORKER_CONNECTIONS:
            raise ValueError(
                f"is {value}; a worker needs at least {MIN_WORKER_CONNECTIONS}: 2 for short statements"
                " and 1 each for handler transactions, lease renewals and bookkeeping"
            )
        return value

    @field_validator("ingress_connections")
    @classmethod
    def _ingress_pool_fits(cls, value: int) -> int:
        if value < MIN_INGRESS_CONNECTIONS:
            raise ValueError(
                f"is {value}; an ingress process needs at least {MIN_INGRESS_CONNECTIONS}: the outbox's"
                " inserts, its relay and the admin API each need one"
            )
        return value

    @field_validator("trusted_proxies_csv", "metrics_allowed_ips_csv")
    @classmethod
    def _cidrs(cls, value: str) -> str:
        parse_networks(value)  # a typo is a start-up error, not a proxy silently untrusted
        return value

    @field_validator("client_address_header")
    @classmethod
    def _forwarding_header(cls, value: str) -> str:
        # Names are case-insensitive; the canonical spelling is what code compares.
        for header in CLIENT_ADDRESS_HEADERS:
            if value.strip().lower() == header.lower():
                return header
        raise ValueError(f"must be one of {', '.join(CLIENT_ADDRESS_HEADERS)}")

    @cached_property
    def trusted_proxies(self) -> tuple[IPv4Network | IPv6Network, ...]:
        return parse_networks(self.trusted_proxies_csv)

    @cached_property
    def metrics_allowed_ips(self) -> tuple[IPv4Network | IPv6Network, ...]:
        return parse_networks(self.metrics_allowed_ips_csv)

    @cached_property
    def redis_urls(self) -> tuple[str, ...]:
        return tuple(url.strip() for url in self.redis_urls_csv.split(",") if url.strip())

    def masked(self) -> dict[str, object]:
        """The effective configuration for the start-up log line, secrets hidden."""
        return {
            "amqp_url": mask_url(self.amqp_url),
            "redis_urls": [mask_url(url) for url in self.redis_urls],
            "database_url": mask_url(self.database_url),
            "namespace": self.namespace,
            "sources_path": self.sources_path or "(built-in demo)",
            "admin_api": "enabled" if self.admin_token else "disabled",
            "console": "enabled" if self.admin_token else "disabled",
            "viewer_token": "set" if self.viewer_token else "unset",
            "incident_notifications": [
                name for name, url in (("slack", self.notify_slack_url), ("webhook", self.notify_webhook_url)) if url
            ],
            "delivery_limit": self.delivery_limit,
            "event_queues": self.event_queues,
            "lock_ttl": self.lock_ttl,
            "heartbeat_seconds": self.heartbeat_seconds,
            "trusted_proxies": [str(network) for network in self.trusted_proxies],
            "client_address_header": self.client_address_header,
            "metrics_allowed_ips": [str(network) for network in self.metrics_allowed_ips],
            "header_timeout": self.header_timeout,
            "body_timeout": self.body_timeout,
            "max_concurrent_requests": self.max_concurrent_requests,
            "max_bodies_per_client": self.max_bodies_per_client,
            "worker_connections": self.worker_connections,
            "ingress_connections": self.ingress_connections,
        }


def parse_networks(csv: str) -> tuple[IPv4Network | IPv6Network, ...]:
    """`"10.0.0.0/8, 2001:db8::/32"` -> networks; ValueError names a bad entry."""
    return tuple(ip_network(entry.strip()) for entry in csv.split(",") if entry.strip())


def mask_url(url: str) -> str:
    """amqp://guest:secret@host/ -> amqp://guest:***@host/, each of a comma-separated list."""
    if "," in url:
        return ",".join(mask_url(part) for part in url.split(","))
    scheme, sep, rest = url.partition("://")
    userinfo, at, hostpart = rest.rpartition("@")
    if not sep or not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user}:***@{hostpart}"


def load_settings() -> Settings:
    try:
        return Settings()
    except ValueError as exc:  # pydantic's ValidationError among them
        raise ConfigError(f"bad environment: {_one_line(exc)}") from exc


def _one_line(exc: ValueError) -> str:
    """`WEBHOOK_INGEST_DELIVERY_LIMIT: Input should be a valid integer, …`,
    one clause per bad variable (the values are not repeated: they may be secrets)."""
    if isinstance(exc, ValidationError):
        return "; ".join(f"{'.'.join(map(str, error['loc']))}: {error['msg']}" for error in exc.errors())
    return " ".join(str(exc).split())
