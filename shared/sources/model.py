"""The sources file (docs/reference.md §3): one section per webhook provider endpoint.

Each section is validated once at start-up by a pydantic model
(`SourceSection`, unknown fields forbidden); its first error becomes one
`ConfigError` line naming the source and the field, so `ingress`, `worker`
and `run` refuse to start rather than fail on the first request. Messages
never echo a secret's value. A source's `handler` is only a name here: the
workers, which run it, look it up (`workers/handlers`); the ingress never
imports handler code.
"""

import importlib.resources
import os
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from ipaddress import IPv4Network, IPv6Network, ip_network
from typing import Annotated, Any, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from webhook_ingest.shared import signatures
from webhook_ingest.shared.errors import ConfigError
from webhook_ingest.shared.event import MAX_BODY_BYTES
from webhook_ingest.shared.event import default_selectors as default_event_type
from webhook_ingest.shared.event import ids as event_id

from . import ignore_rules
from . import ordering as ordering_rules
from . import routes as route_rules
from .ordering import OrderingRule
from .retention import DEFAULT_RETENTION, parse_retention
from .routes import Route

Network = IPv4Network | IPv6Network
_Parsed = TypeVar("_Parsed")  # what a parser of a source's field gives


def _problem(message: str) -> PydanticCustomError:
    """A validation error whose message is ours, word for word."""
    return PydanticCustomError("source_config", "{problem}", {"problem": message})


def resolve_secret(secret: str) -> str:
    """`env:NAME` reads the environment, `file:/path` a file (Docker and
    Kubernetes secrets; one trailing newline stripped), anything else is the
    secret itself."""
    if secret.startswith("env:"):
        value = os.environ.get(secret[4:])
        if not value:
            raise _problem(f"environment variable {secret[4:]} is not set")
        return value
    if secret.startswith("file:"):
        return _read_secret_file(secret[5:])
    return secret


def _read_secret_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as file:
            value = file.read().removesuffix("\n").removesuffix("\r")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or "not UTF-8 text"
        raise _problem(f"cannot read secret file {path}: {reason}") from None
    if not value:
        raise _problem(f"secret file {path} is empty")
    return value


def _network(value: Any) -> Any:
    if not isinstance(value, str):
        return value  # the strict type check answers
    try:
        return ip_network(value)
    except ValueError as exc:
        raise _problem(f"{exc} (a CIDR such as 192.30.252.0/22 or 2001:db8::/32)") from None


Secret = Annotated[str, Field(min_length=1), AfterValidator(resolve_secret)]
AllowedNetwork = Annotated[Network, BeforeValidator(_network)]


class RateLimit(BaseModel):
    """A token bucket: `burst` requests at once, refilled at `per_second`."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    per_second: float = Field(gt=0)
    burst: int = Field(ge=1)


class RouteSection(BaseModel):
    """One `[[sources.NAME.routes]]` table (shared/sources/routes.py)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: str | None = None
    handler: str = Field(min_length=1)
    types: list[str] | None = None
    handler_options: dict[str, Any] = {}
    ordering: dict[str, Any] | None = None  # shared/sources/ordering.py; replaces the source's

    @field_validator("types", mode="before")
    @classmethod
    def _one_type_is_a_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value


class SourceSection(BaseModel):
    """One `[sources.NAME]` table, as written (secrets resolved)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    scheme: str
    secrets: list[Secret] = Field(min_length=1)
    handler: str | None = Field(None, min_length=1)
    routes: list[RouteSection] | None = Field(None, min_length=1)
    event_id: list[str] | None = None
    tolerance_seconds: float = Field(300, gt=0)
    max_body_bytes: int = Field(1_048_576, ge=1)
    max_attempts: int = Field(5, ge=1)
    retry_delays: list[Annotated[float, Field(gt=0)]] = Field([1, 10, 60, 300], min_length=1)
    hash_fields: list[str] = []
    fallback_hash: bool = True
    signature_header: str = "X-Signature"
    public_url: str | None = None
    handler_options: dict[str, Any] = {}
    allowed_ips: list[AllowedNetwork] = []
    rate_limit: RateLimit | None = None
    retention: str = "7d"
    event_type: list[str] | None = None
    ignore: dict[str, Any] = {}
    ordering: dict[str, Any] | None = None  # shared/sources/ordering.py

    @field_validator("event_id", "event_type", mode="before")
    @classmethod
    def _one_selector_is_a_list(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @model_validator(mode="after")
    def _a_handler_or_routes(self) -> "SourceSection":
        if self.routes is None and self.handler is None:
            raise _problem("handler: is required (or [[sources.NAME.routes]], each naming its handler)")
        if self.routes is not None and self.handler is not None:
            raise _problem("routes: a source has one handler or routes, not both (each route names its own handler)")
        if self.routes is not None and "handler_options" in self.model_fields_set:
            raise _problem("handler_options: put them in each route (a source with routes has none of its own)")
        return self

    @field_validator("scheme")
    @classmethod
    def _known_scheme(cls, scheme: str) -> str:
        if scheme not in signatures.SCHEMES:
            raise _problem(f"unknown scheme {scheme!r} (known: {', '.join(signatures.SCHEMES)})")
        return scheme

    @field_validator("event_id", "event_type")
    @classmethod
    def _valid_selectors(cls, specs: list[str] | None) -> list[str] | None:
        if specs is not None:
            _parsed(event_id.parse_selectors, specs)
        return specs

    @field_validator("retention")
    @classmethod
    def _a_duration(cls, text: str) -> str:
        try:
            parse_retention(text)
        except ValueError as exc:
            raise _problem(str(exc)) from None
        return text

    @field_validator("max_body_bytes")
    @classmethod
    def _one_broker_message(cls, limit: int) -> int:
        if limit > MAX_BODY_BYTES:
            raise _problem(
                f"at most {MAX_BODY_BYTES} (128 MiB, RabbitMQ's default max_message_size, less room for"
                f" the headers): a larger event would be accepted and never published, got {limit}"
            )
        return limit

    @field_validator("hash_fields")
    @classmethod
    def _valid_hash_fields(cls, paths: list[str]) -> list[str]:
        _parsed(event_id.parse_hash_fields, paths)
        return paths


def _parsed(parse: Callable[[Sequence[str]], _Parsed], specs: Sequence[str]) -> _Parsed:
    try:
        return parse(specs)
    except event_id.SelectorError as exc:
        raise _problem(str(exc)) from None


@dataclass(frozen=True)
class Source:
    name: str
    scheme: str
    handler: str  # "" for a source with routes
    verifier: signatures.Verifier = field(repr=False)
    event_id_selectors: tuple = ()
    hash_fields: tuple[str, ...] = ()
    fallback_hash: bool = True
    tolerance_seconds: float = 300
    max_body_bytes: int = 1_048_576
    max_attempts: int = 5
    retry_delays: tuple[float, ...] = (1, 10, 60, 300)
    signature_header: str = "X-Signature"
    public_url: str | None = None
    handler_options: dict[str, Any] = field(default_factory=dict)
    secrets: tuple[str, ...] = field(default=(), repr=False)
    allowed_ips: tuple[Network, ...] = ()  # empty: any client address
    rate_limit: RateLimit | None = None
    retention: timedelta = DEFAULT_RETENTION  # how long the archive keeps its events (0: not archived)
    event_type_selectors: tuple = ()
    ignore: ignore_rules.IgnoreRules = field(default_factory=ignore_rules.IgnoreRules)
    routes: tuple[Route, ...] = ()  # empty: the one `handler`
    ordering: OrderingRule | None = None  # None: its events run in any order

    @property
    def ordered(self) -> bool:
        """Whether any of its runs keeps an order: its own `ordering`, or a route's."""
        return self.ordering is not None or any(route.ordering is not None for route in self.routes)

    def ordering_for(self, route: str) -> OrderingRule | None:
        """The ordering of `route`'s runs ("": the source's own): the route's own, else the source's."""
        if not route:
            return self.ordering
        found = next((r for r in self.routes if r.name == route), None)
        return found.ordering if found is not None and found.ordering is not None else self.ordering

    def handler_for(self, route: str) -> tuple[str, dict[str, Any]]:
        """The handler and its options that run `route` ("": the source's one handler)."""
        if not route:
            return self.handler, self.handler_options
        found = next((r for r in self.routes if r.name == route), None)
        if found is None:
            raise KeyError(f"source {self.name!r} has no route {route!r}")
        return found.handler, found.handler_options

    def routes_taking(self, headers: Mapping[str, str], payload: object) -> list[Route]:
        """The routes whose filter takes the event, in the file's order."""
        return [route for route in self.routes if route.takes(headers, payload)]

    def retry_delay(self, failed_attempt: int) -> float:
        """Seconds to wait before attempt `failed_attempt + 1`; the last delay repeats."""
        return self.retry_delays[min(failed_attempt, len(self.retry_delays)) - 1]


def load_sources(path: str | None) -> dict[str, Source]:
    """Read the sources file at `path`, or the built-in demo file when None."""
    if path is None:
        text = importlib.resources.files("webhook_ingest.shared").joinpath("demo_sources.toml").read_text()
        where = "built-in demo sources"
    else:
        try:
            with open(path, encoding="utf-8") as file:
                text = file.read()
        except OSError as exc:
            raise ConfigError(f"sources file {path}: {exc.strerror}") from exc
        where = f"sources file {path}"
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{where}: invalid TOML: {exc}") from exc
    sections = document.get("sources")
    if not isinstance(sections, dict) or not sections:
        raise ConfigError(f"{where}: no [sources.NAME] section")
    return {name: parse_source(name, section) for name, section in sections.items()}


def parse_source(name: str, section: Any) -> Source:
    """One validated `Source`, or a one-line `ConfigError` naming `name` and the field."""
    if not name or ":" in name or "/" in name or "#" in name:
        # the last part of its URL, and its keys' part before the first ':'
        # (SOURCE:EVENT_ID): `acme` with event id `eu:1` and `acme:eu` with
        # `1` would share one key. And a route's handler and delivery rate
        # are filed under SOURCE#ROUTE: `acme#billing` would be `acme`'s
        # route `billing` (shared/sources/routes.py)
        raise ConfigError(
            f"source {name!r}: name: must be non-empty, without ':', '/' or '#' (it starts the"
            " source's idempotency keys, SOURCE:EVENT_ID, ends its URL, and SOURCE#ROUTE names a"
            " route)"
        )
    if not isinstance(section, dict):
        raise ConfigError(f"source {name!r}: section: must be a table")
    try:
        config = SourceSection.model_validate(section)
    except ValidationError as exc:
        raise ConfigError(f"source {name!r}: {first_problem(exc)}") from None
    verifier = _verifier(name, config)
    selectors = config.event_id if config.event_id is not None else event_id.DEFAULT_EVENT_ID[config.scheme]
    event_type = event_id.parse_selectors(
        config.event_type if config.event_type is not None else default_event_type(config.scheme)
    )
    return Source(
        name=name,
        scheme=config.scheme,
        handler=config.handler or "",
        verifier=verifier,
        event_id_selectors=event_id.parse_selectors(selectors),
        hash_fields=tuple(config.hash_fields),
        fallback_hash=config.fallback_hash,
        tolerance_seconds=config.tolerance_seconds,
        max_body_bytes=config.max_body_bytes,
        max_attempts=config.max_attempts,
        retry_delays=tuple(float(d) for d in config.retry_delays),
        signature_header=config.signature_header,
        public_url=config.public_url,
        handler_options=config.handler_options,
        secrets=tuple(config.secrets),
        allowed_ips=tuple(config.allowed_ips),
        rate_limit=config.rate_limit,
        retention=parse_retention(config.retention),
        event_type_selectors=event_type,
        ignore=_ignore_rules(name, config.ignore, event_type),
        routes=_routes(name, config.routes or [], event_type),
        ordering=_ordering(name, config.ordering),
    )


def _verifier(name: str, config: SourceSection) -> signatures.Verifier:
    # api-key has no default header: only one the file names
    header = config.signature_header if "signature_header" in config.model_fields_set else None
    try:
        return signatures.build_verifier(
            config.scheme,
            config.secrets,
            tolerance_seconds=config.tolerance_seconds,
            signature_header=header,
            public_url=config.public_url,
        )
    except signatures.SchemeConfigError as exc:
        raise ConfigError(f"source {name!r}: {exc.field}: {exc}") from None
    except ValueError as exc:
        raise ConfigError(f"source {name!r}: secrets: {exc}") from None


def _ignore_rules(name: str, table: dict[str, Any], event_type: tuple) -> ignore_rules.IgnoreRules:
    try:
        return ignore_rules.parse(table, event_type)
    except ignore_rules.IgnoreRuleError as exc:
        raise ConfigError(f"source {name!r}: ignore.{exc.where}: {exc}") from None


def _ordering(name: str, table: dict[str, Any] | None) -> OrderingRule | None:
    try:
        return ordering_rules.parse_optional(table)
    except ordering_rules.OrderingError as exc:
        raise ConfigError(f"source {name!r}: {exc.where}: {exc}") from None


def _routes(name: str, sections: list[RouteSection], event_type: tuple) -> tuple[Route, ...]:
    entries = [section.model_dump(exclude_unset=True) for section in sections]
    try:
        return route_rules.parse(entries, event_type)
    except route_rules.RouteError as exc:
        raise ConfigError(f"source {name!r}: {exc.where}: {exc}") from None


# What a type or range error means for each field, in the file's own terms
# ("[]" stands for any list index).
_EXPECTED = {
    "scheme": "must be a string",
    "secrets": "a non-empty list of secrets is required",
    "secrets[]": "must be a non-empty string",
    "handler": "must be a non-empty string",
    "routes": "must be a non-empty list of [[sources.NAME.routes]] tables",
    "routes[]": 'must be a table { handler = "module:function", types = ["invoice.*"] }',
    "routes[].name": "must be a string",
    "routes[].handler": "must be a non-empty string",
    "routes[].types": "must be a list of event type globs",
    "routes[].types[]": "must be an event type glob string",
    "routes[].handler_options": "must be a table",
    "routes[].ordering": 'must be a table { key = "body:PATH" }',
    "event_id": "must be a list of selector strings",
    "event_id[]": "must be a selector string",
    "tolerance_seconds": "must be a positive number",
    "max_body_bytes": "must be a positive integer",
    "max_attempts": "must be a positive integer",
    "retry_delays": "must be a non-empty list of positive seconds",
    "retry_delays[]": "must be a positive number of seconds",
    "hash_fields": "must be a list of dotted paths",
    "hash_fields[]": "must be a dotted path string",
    "fallback_hash": "must be true or false",
    "signature_header": "must be a string",
    "public_url": "must be a string, the URL the provider calls",
    "handler_options": "must be a table",
    "allowed_ips": "must be a list of CIDRs",
    "allowed_ips[]": "must be a CIDR string such as 192.30.252.0/22 or 2001:db8::/32",
    "rate_limit": "must be a table { per_second = N, burst = N }",
    "rate_limit.per_second": "must be a positive number",
    "rate_limit.burst": "must be a positive integer",
    "retention": "must be a duration string such as 30d, 12h or 0d (not archived)",
    "event_type": "must be a list of selector strings",
    "event_type[]": "must be a selector string",
    "ignore": 'must be a table of rules, e.g. { type = ["ping", "charge.*"] }',
    "ordering": 'must be a table { key = "body:PATH" }',
}


def first_problem(exc: ValidationError) -> str:
    """`field: problem` for the error that matters most: an unknown field
    first (a misspelt name also makes its intended field look missing)."""
    errors = exc.errors(include_input=False, include_url=False)
    error = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    where, pattern = _location(error["loc"])
    if error["type"] == "extra_forbidden":
        fields = RouteSection.model_fields if pattern.startswith("routes[]") else SourceSection.model_fields
        return f"{where}: unknown field (known: {', '.join(sorted(fields))})"
    if error["type"] == "missing":
        return f"{where}: {'a non-empty list of secrets is required' if where == 'secrets' else 'is required'}"
    if error["type"] == "source_config":
        return error["msg"] if where == "section" else f"{where}: {error['msg']}"  # "section": says its field
    return f"{where}: {_EXPECTED.get(pattern, _EXPECTED.get(pattern.split('[')[0], 'is invalid'))}"


def _location(loc: tuple) -> tuple[str, str]:
    """(`secrets[1]`, `secrets[]`) from pydantic's ('secrets', 1); union
    member tags, which are not field names, are left out."""
    where = pattern = ""
    for part in loc:
        if isinstance(part, int):
            where, pattern = f"{where}[{part}]", f"{pattern}[]"
        elif part.isidentifier():
            dot = "." if where else ""
            where, pattern = f"{where}{dot}{part}", f"{pattern}{dot}{part}"
    return where or "section", pattern
