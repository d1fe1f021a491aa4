"""The sources file (SPEC §3): one section per webhook provider endpoint.

Loaded and validated once at start-up; every mistake becomes one
`ConfigError` line naming the source and the field, so `ingress`, `worker`
and `run` refuse to start rather than fail on the first request.
"""

import importlib
import importlib.resources
import os
import tomllib
from dataclasses import dataclass, field
from typing import Any

from webhook_ingest.shared import event_id, signatures
from webhook_ingest.shared.errors import ConfigError

BUILTIN_HANDLERS = frozenset({"inbox", "forward"})

_FIELDS = {
    "scheme", "secrets", "handler", "event_id", "tolerance_seconds", "max_body_bytes",
    "max_attempts", "retry_delays", "hash_fields", "fallback_hash", "signature_header",
    "handler_options",
}


@dataclass(frozen=True)
class Source:
    name: str
    scheme: str
    handler: str
    verifier: signatures.Verifier = field(repr=False)
    event_id_selectors: tuple = ()
    hash_fields: tuple[str, ...] = ()
    fallback_hash: bool = True
    tolerance_seconds: float = 300
    max_body_bytes: int = 1_048_576
    max_attempts: int = 5
    retry_delays: tuple[float, ...] = (1, 10, 60, 300)
    signature_header: str = "X-Signature"
    handler_options: dict[str, Any] = field(default_factory=dict)
    secrets: tuple[str, ...] = field(default=(), repr=False)

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
    def fail(field_name: str, problem: str) -> ConfigError:
        return ConfigError(f"source {name!r}: {field_name}: {problem}")

    if not isinstance(section, dict):
        raise fail("section", "must be a table")
    unknown = set(section) - _FIELDS
    if unknown:
        raise fail(sorted(unknown)[0], f"unknown field (known: {', '.join(sorted(_FIELDS))})")
    scheme = _required(section, "scheme", str, fail)
    if scheme not in signatures.SCHEMES:
        raise fail("scheme", f"unknown scheme {scheme!r} (known: {', '.join(signatures.SCHEMES)})")
    secrets = tuple(_resolve_secret(s, i, fail) for i, s in enumerate(_secret_list(section, fail)))
    handler = _required(section, "handler", str, fail)
    validate_handler(handler, fail)
    options = _optional(section, "handler_options", dict, {}, fail)
    if handler == "forward" and not isinstance(options.get("url"), str):
        raise fail("handler_options.url", "the forward handler needs a url")
    tolerance = _number(section, "tolerance_seconds", 300, fail)
    signature_header = _optional(section, "signature_header", str, "X-Signature", fail)
    try:
        verifier = signatures.build_verifier(
            scheme, secrets, tolerance_seconds=tolerance, signature_header=signature_header
        )
    except ValueError as exc:
        raise fail("secrets", str(exc)) from exc
    return Source(
        name=name,
        scheme=scheme,
        handler=handler,
        verifier=verifier,
        event_id_selectors=_selectors(section, scheme, fail),
        hash_fields=_hash_fields(section, fail),
        fallback_hash=_optional(section, "fallback_hash", bool, True, fail),
        tolerance_seconds=tolerance,
        max_body_bytes=_positive_int(section, "max_body_bytes", 1_048_576, fail),
        max_attempts=_positive_int(section, "max_attempts", 5, fail),
        retry_delays=_retry_delays(section, fail),
        signature_header=signature_header,
        handler_options=options,
        secrets=secrets,
    )


def validate_handler(reference: str, fail) -> None:
    """A built-in name, or `module:function` naming an importable async callable."""
    if reference in BUILTIN_HANDLERS:
        return
    module_name, sep, attribute = reference.partition(":")
    if not sep or not module_name or not attribute:
        raise fail("handler", f"{reference!r} is neither a built-in ({', '.join(sorted(BUILTIN_HANDLERS))}) nor 'module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise fail("handler", f"cannot import {module_name!r}: {exc}") from exc
    if not callable(getattr(module, attribute, None)):
        raise fail("handler", f"{module_name!r} has no callable {attribute!r}")


def _secret_list(section: dict, fail) -> list:
    secrets = section.get("secrets")
    if not isinstance(secrets, list) or not secrets:
        raise fail("secrets", "a non-empty list of secrets is required")
    return secrets


def _resolve_secret(secret: Any, index: int, fail) -> str:
    if not isinstance(secret, str) or not secret:
        raise fail(f"secrets[{index}]", "must be a non-empty string")
    if not secret.startswith("env:"):
        return secret
    variable = secret[4:]
    value = os.environ.get(variable)
    if not value:
        raise fail(f"secrets[{index}]", f"environment variable {variable} is not set")
    return value


def _selectors(section: dict, scheme: str, fail) -> tuple:
    specs = section.get("event_id", event_id.DEFAULT_EVENT_ID[scheme])
    if isinstance(specs, str):
        specs = [specs]
    if not isinstance(specs, (list, tuple)) or not all(isinstance(s, str) for s in specs):
        raise fail("event_id", "must be a list of selector strings")
    try:
        return event_id.parse_selectors(specs)
    except event_id.SelectorError as exc:
        raise fail("event_id", str(exc)) from exc


def _hash_fields(section: dict, fail) -> tuple[str, ...]:
    paths = _optional(section, "hash_fields", list, [], fail)
    try:
        return event_id.parse_hash_fields(paths)
    except event_id.SelectorError as exc:
        raise fail("hash_fields", str(exc)) from exc


def _retry_delays(section: dict, fail) -> tuple[float, ...]:
    delays = _optional(section, "retry_delays", list, [1, 10, 60, 300], fail)
    if not delays or not all(_is_number(d) and d > 0 for d in delays):
        raise fail("retry_delays", "must be a non-empty list of positive seconds")
    return tuple(float(d) for d in delays)


def _required(section: dict, key: str, kind: type, fail):
    if key not in section:
        raise fail(key, "is required")
    return _optional(section, key, kind, None, fail)


def _optional(section: dict, key: str, kind: type, default, fail):
    value = section.get(key, default)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise fail(key, f"must be a {kind.__name__}")
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number(section: dict, key: str, default: float, fail) -> float:
    value = section.get(key, default)
    if not _is_number(value) or value <= 0:
        raise fail(key, "must be a positive number")
    return value


def _positive_int(section: dict, key: str, default: int, fail) -> int:
    value = section.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise fail(key, "must be a positive integer")
    return value
