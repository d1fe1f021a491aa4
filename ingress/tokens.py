"""The two tokens of docs/reference.md §3 and the roles they give: the operator's
(`WEBHOOK_INGEST_ADMIN_TOKEN`: read, replay, discard) and the viewer's
(`WEBHOOK_INGEST_VIEWER_TOKEN`: read only). The admin API and the console
both ask here, so a token means the same in both."""

import hmac

from webhook_ingest.shared.settings import Settings

OPERATOR = "operator"
VIEWER = "viewer"


def role_of(presented: str, settings: Settings) -> str | None:
    """The role `presented` gives, or None. Constant time in the tokens'
    content; both are always compared, so timing does not tell which matched.
    A header's bytes that are not UTF-8 reach us as lone surrogates (aiohttp's
    surrogateescape): encoded back to those bytes, they simply match nothing."""
    presented_bytes = presented.encode("utf-8", "surrogateescape")
    is_operator = _same(presented_bytes, settings.admin_token)
    is_viewer = _same(presented_bytes, settings.viewer_token)
    if is_operator:
        return OPERATOR
    return VIEWER if is_viewer else None


def may_change(role: str | None) -> bool:
    return role == OPERATOR


def _same(presented: bytes, token: str | None) -> bool:
    if not token:  # unset: nothing matches it, not even an empty string
        return False
    return hmac.compare_digest(presented, token.encode())
