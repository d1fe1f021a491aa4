"""The settings (shared/settings.py): what they refuse, and why."""

import pytest

from webhook_ingest.shared.settings import Settings


@pytest.mark.parametrize("variable", ["WEBHOOK_INGEST_ADMIN_TOKEN", "WEBHOOK_INGEST_VIEWER_TOKEN"])
def test_a_token_shorter_than_32_characters_is_refused_saying_why(variable):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as refused:
        Settings(**{variable: "x" * 31})
    assert variable in str(refused.value) and "32 characters" in str(refused.value)
    assert Settings(**{variable: "x" * 32})  # long enough
