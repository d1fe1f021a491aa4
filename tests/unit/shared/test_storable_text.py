"""shared/storable_text.py, and the JSON log lines that use it: whatever a
handler's error says, it can be written to Postgres and to the log."""

import io
import logging

import orjson
import structlog
from hypothesis import given
from hypothesis import strategies as st

from webhook_ingest.shared.observability.logging import configure_logging
from webhook_ingest.shared.storable_text import cleaned, storable

# Every code point, lone surrogates and NUL included.
any_text = st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF))


@given(any_text)
def test_storable_text_is_utf8_without_nul_one_character_for_one(text):
    result = storable(text)
    result.encode("utf-8")  # no lone surrogate left
    assert "\x00" not in result and len(result) == len(text)


@given(st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00")))
def test_text_already_storable_is_kept_as_it_is(text):
    assert storable(text) == text


@given(
    st.recursive(
        any_text | st.integers(-(2**63), 2**63 - 1), lambda inner: st.lists(inner) | st.dictionaries(any_text, inner)
    )
)
def test_cleaned_values_are_json_that_orjson_writes(value):
    orjson.dumps(cleaned(value))


def test_a_log_line_quoting_a_lone_surrogate_is_written_not_raised(monkeypatch):
    """Before: orjson raised TypeError into the caller of log.error — the
    worker's task running the message died (adversary round 6, R6-2)."""
    written = io.BytesIO()
    monkeypatch.setattr("sys.stderr", io.TextIOWrapper(written))
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    configure_logging("json", logging.INFO)
    try:
        structlog.get_logger("test").error("event_dead_lettered", error="caf\udce9 \x00", extra={"k\udcff": 1})
        line = orjson.loads(written.getvalue())
    finally:
        structlog.reset_defaults()
        root.handlers[:], root.level = handlers, level
    assert (line["event"], line["error"], line["extra"]) == ("event_dead_lettered", "caf\ufffd \ufffd", {"k\ufffd": 1})
