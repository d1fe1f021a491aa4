"""Incidents: failures grouped by what went wrong (docs/oncall.md, "Incidents").

A failure — a dead letter, or a retry of an event still failing — belongs
to the incident of its source, its handler and the fingerprint of its
error: the error's type and its message with what changes from one event to
the next masked (URLs, e-mail addresses, UUIDs, ids, hex strings, numbers).
"ConnectionError: POST https://crm.example/v1/orders/8812 timed out after
30 s" and the same for order 8813 are one incident; a 500 and a 404 from
the same downstream are two.

This module is the pure part: the masking and the fingerprint. The rows
are written by `record_failure` in the transaction that records the
failure, and read and acted on through `shared.incidents.store`.
"""

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

PATTERN_CHARS = 500  # of the masked message kept and fingerprinted: a stack of repeats is one pattern

# Order matters: a URL holds numbers and ids, an e-mail address holds dots.
_MASKS = (
    ("<url>", re.compile(r"\b[a-z][a-z0-9+.\-]*://[^\s'\"<>]+", re.IGNORECASE)),
    ("<email>", re.compile(r"\b[\w.+\-]+@[\w\-]+(?:\.[\w\-]+)+\b")),
    ("<uuid>", re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b", re.IGNORECASE)),
    # Provider ids: a prefix and an underscore or dash, then letters and digits (evt_1Nx9, cus_Q2, msg-2a9).
    ("<id>", re.compile(r"\b[A-Za-z]{2,12}[_\-](?=[A-Za-z0-9]*\d)[A-Za-z0-9]+\b")),
    ("<hex>", re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{8,}\b", re.IGNORECASE)),
    ("<n>", re.compile(r"\d+(?:\.\d+)?")),
)


@dataclass(frozen=True)
class Fingerprint:
    error_type: str
    pattern: str  # the message, masked
    digest: str  # what groups: sha256 of type and pattern, hex

    @classmethod
    def of(cls, error_type: str, message: str) -> "Fingerprint":
        pattern = mask(message)
        digest = hashlib.sha256(f"{error_type}\n{pattern}".encode()).hexdigest()
        return cls(error_type, pattern, digest)


def mask(message: str) -> str:
    """`message` with what varies between events replaced by placeholders,
    whitespace runs made one space, cut to PATTERN_CHARS."""
    for placeholder, pattern in _MASKS:
        message = pattern.sub(placeholder, message)
    return " ".join(message.split())[:PATTERN_CHARS].rstrip()


def incident_document(row: Mapping[str, Any]) -> dict:
    """One incident as `incidents list --json` and `GET /admin/incidents` give it."""
    return {
        "id": int(row["id"]),
        "state": row["state"],
        "source": row["source"],
        "handler": row["handler"],
        "error_type": row["error_type"],
        "error_pattern": row["error_pattern"],
        "last_error": row["last_error"],
        "failures": int(row["failures"]),
        "dead_letters": int(row["dead_letters"]),
        "first_seen": _iso(row["first_seen"]),
        "last_seen": _iso(row["last_seen"]),
        "opened_at": _iso(row["opened_at"]),
        "acknowledged_by": row["acknowledged_by"],
        "acknowledged_at": _iso(row["acknowledged_at"]),
        "resolved_by": row["resolved_by"],
        "resolved_at": _iso(row["resolved_at"]),
    }


def event_document(row: Mapping[str, Any]) -> dict:
    """One event of an incident."""
    return {
        "key": row["key"],
        "event_id": row["event_id"],
        "failures": int(row["failures"]),
        "last_attempt": int(row["last_attempt"]),
        "dead_letter_id": row["dead_letter_id"],
        "dead_letter_status": row["dead_letter_status"],
        "first_failed_at": _iso(row["first_failed_at"]),
        "last_failed_at": _iso(row["last_failed_at"]),
    }


def _iso(moment: datetime | None) -> str | None:
    return moment.astimezone(UTC).isoformat() if moment else None
