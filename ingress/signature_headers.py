"""Signature headers in what the admin API and the console show (docs/security.md, "The event archive").

A signature header with its body is the request itself: whoever reads both
can send it again (a duplicate then, reference §4-5, but a duplicate only
while its key is remembered). So the archive's and the dead letters'
headers are shown with every scheme's signature headers hidden (and each
source's own `signature_header`); the operator token sees them by asking,
`?signatures=show`, for provenance after an incident; the viewer asking is
refused (403). The CLI reads the database, as an operator does, and shows them.
"""

from typing import Any

from aiohttp import web

from webhook_ingest.shared.signatures import SIGNATURE_HEADERS
from webhook_ingest.shared.sources import Source

from .appkeys import sources_key

HIDDEN = "(hidden: a signature header)"
ASKED = "show"


def asked(request: web.Request) -> bool:
    """Whether the request asks to see the signature headers."""
    return request.query.get("signatures") == ASKED


def hidden_names(request: web.Request) -> frozenset[str]:
    """The lower-case header names to hide from this request: none when it asked (its role checked first)."""
    return frozenset() if asked(request) else names(request.config_dict[sources_key])


def names(sources: dict[str, Source]) -> frozenset[str]:
    return SIGNATURE_HEADERS | {source.signature_header.lower() for source in sources.values()}


def hide(headers: Any, names: frozenset[str]) -> Any:
    """`headers` (a name -> value object, as stored) with the values of `names` hidden; anything else as it is."""
    if not names or not isinstance(headers, dict):
        return headers
    return {
        name: HIDDEN if isinstance(name, str) and name.lower() in names else value for name, value in headers.items()
    }
