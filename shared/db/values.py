"""Values as Postgres stores them and the JSON documents show them: jsonb
text that any string fits in, instants in UTC, one JSON document as bytes.

Shared by every store and every JSON shape (dead letters, replays, the
archive, the audit log), so none of them imports another for a helper.
"""

import json
from datetime import UTC, datetime

import orjson

from webhook_ingest.shared.storable_text import cleaned


def jsonb(value: object) -> str:
    """Headers and errors as jsonb text, whatever strings they hold: a lone
    surrogate (an undecodable header byte) or NUL becomes U+FFFD."""
    try:
        text = orjson.dumps(value, default=str)
    except TypeError:  # orjson refuses lone surrogates
        text = orjson.dumps(cleaned(value), default=str)
    return text.replace(b"\\u0000", b"\\ufffd").decode()


def iso_utc(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat()


def to_json(document: object) -> bytes:
    """One JSON document. orjson, unless a payload holds an integer wider than
    64 bits (orjson refuses those; the standard library writes them exactly)."""
    try:
        return orjson.dumps(document)
    except orjson.JSONEncodeError:
        return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
