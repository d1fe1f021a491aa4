"""`webhook-ingest` itself (webhook_ingest/cli/main.py), without services."""

from webhook_ingest.shared.settings import Settings

OPERATOR_TOKEN = "operator-token-of-the-unit-tests-0123456789"


def test_make_run_says_where_the_console_is_or_how_to_turn_it_on():
    from webhook_ingest.cli.main import console_line

    on = console_line(Settings(WEBHOOK_INGEST_ADMIN_TOKEN=OPERATOR_TOKEN), "127.0.0.1", 8080)
    assert on.startswith("console: http://127.0.0.1:8080/console/")
    off = console_line(Settings(WEBHOOK_INGEST_ADMIN_TOKEN=""), "127.0.0.1", 8080)
    assert "WEBHOOK_INGEST_ADMIN_TOKEN" in off and "http" not in off
