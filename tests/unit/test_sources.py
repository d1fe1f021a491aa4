"""The sources file (SPEC §3): what loads, and the one line a mistake gives."""

import pytest

from webhook_ingest.shared.errors import ConfigError
from webhook_ingest.shared.sources import load_sources

VALID = '''
[sources.shop]
scheme = "shopify"
secrets = ["env:SHOP_SECRET", "literal-old"]
handler = "inbox"
retry_delays = [0.5, 2]
max_attempts = 3
hash_fields = ["order.id"]
'''


def load(tmp_path, text):
    path = tmp_path / "sources.toml"
    path.write_text(text)
    return load_sources(str(path))


def test_a_valid_file_loads_with_defaults_and_env_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("SHOP_SECRET", "from-env")
    [source] = load(tmp_path, VALID).values()
    assert source.secrets == ("from-env", "literal-old")
    assert source.max_body_bytes == 1_048_576 and source.tolerance_seconds == 300
    assert [source.retry_delay(n) for n in (1, 2, 3, 4)] == [0.5, 2, 2, 2]  # the last delay repeats
    assert source.hash_fields == ("order.id",)


def test_the_built_in_demo_source_needs_no_file():
    sources = load_sources(None)
    assert list(sources) == ["demo"] and sources["demo"].handler == "inbox"


@pytest.mark.parametrize("section, field, problem", [
    ('scheme = "sha1"\nsecrets = ["s"]\nhandler = "inbox"', "scheme", "unknown scheme"),
    ('scheme = "github"\nhandler = "inbox"', "secrets", "non-empty list"),
    ('scheme = "github"\nsecrets = ["env:NOT_SET_ANYWHERE"]\nhandler = "inbox"', "secrets[0]", "NOT_SET_ANYWHERE is not set"),
    ('scheme = "github"\nsecrets = ["s"]\nhandler = "nope"', "handler", "neither a built-in"),
    ('scheme = "github"\nsecrets = ["s"]\nhandler = "no_such_module_xyz:handle"', "handler", "cannot import"),
    ('scheme = "github"\nsecrets = ["s"]\nhandler = "json:no_such_function"', "handler", "no callable"),
    ('scheme = "github"\nsecrets = ["s"]\nhandler = "inbox"\nevent_id = ["cookie:x"]', "event_id", ""),
    ('scheme = "github"\nsecrets = ["s"]\nhandler = "inbox"\nevent_id = ["{body.a"]', "event_id", ""),
    ('scheme = "github"\nsecrets = ["s"]\nhandler = "inbox"\nretry_delays = []', "retry_delays", "non-empty"),
    ('scheme = "github"\nsecrets = ["s"]\nhandler = "inbox"\nmax_attempts = 0', "max_attempts", "positive integer"),
    ('scheme = "github"\nsecrets = ["s"]\nhandler = "inbox"\nmax_body_bytes = true', "max_body_bytes", "positive integer"),
    ('scheme = "github"\nsecrets = ["s"]\nhandler = "inbox"\ncolour = "red"', "colour", "unknown field"),
    ('scheme = "github"\nsecrets = ["s"]\nhandler = "forward"', "handler_options.url", "needs a url"),
    ('scheme = "standard-webhooks"\nsecrets = ["whsec_"]\nhandler = "inbox"', "secrets", "no key bytes"),
])
def test_each_mistake_is_one_line_naming_the_source_and_the_field(tmp_path, section, field, problem):
    with pytest.raises(ConfigError) as raised:
        load(tmp_path, f"[sources.acme]\n{section}\n")
    message = str(raised.value)
    assert message.startswith(f"source 'acme': {field}: ")
    assert problem in message and "\n" not in message


@pytest.mark.parametrize("text, problem", [
    ("[sources.a\n", "invalid TOML"),
    ("[other]\nx = 1\n", r"no \[sources\.NAME\] section"),
])
def test_a_broken_file_names_the_file(tmp_path, text, problem):
    with pytest.raises(ConfigError, match=problem):
        load(tmp_path, text)


def test_a_missing_file_names_the_path(tmp_path):
    with pytest.raises(ConfigError, match="nowhere.toml"):
        load_sources(str(tmp_path / "nowhere.toml"))
