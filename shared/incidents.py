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
failure, and read and acted on through `shared.incident_store`.
"""

import hashlib
import re
from dataclasses import dataclass

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
