"""The roles the operator and viewer tokens give (ingress/tokens.py)."""

from webhook_ingest.ingress.tokens import OPERATOR, VIEWER, role_of
from webhook_ingest.shared.settings import Settings

OPERATOR_TOKEN = "operator-token-of-the-unit-tests-0123456789"

VIEWER_TOKEN = "viewer-token-of-the-unit-tests-0123456789"


def test_each_token_gives_its_role_and_nothing_else_does():
    settings = Settings(WEBHOOK_INGEST_ADMIN_TOKEN=OPERATOR_TOKEN, WEBHOOK_INGEST_VIEWER_TOKEN=VIEWER_TOKEN)
    assert role_of(OPERATOR_TOKEN, settings) == OPERATOR
    assert role_of(VIEWER_TOKEN, settings) == VIEWER
    for wrong in ("", OPERATOR_TOKEN[:-1], OPERATOR_TOKEN + " ", "viewer", OPERATOR_TOKEN.upper()):
        assert role_of(wrong, settings) is None, wrong
    assert role_of("", Settings(WEBHOOK_INGEST_ADMIN_TOKEN=OPERATOR_TOKEN)) is None  # no viewer token: no empty match
