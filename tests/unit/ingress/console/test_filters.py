"""The console's pure parts: the filter parser (whatever a URL holds), the
origin and CSRF checks, the roles the tokens give, the vendored htmx."""

import hashlib
from datetime import UTC, datetime
from urllib.parse import parse_qsl

import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict

from tests.support.repository import ROOT
from webhook_ingest.ingress.console import vendor
from webhook_ingest.ingress.console.filters import (
    FIELDS,
    MAX_TEXT,
    form_values,
    parse_before,
    parse_filter,
    query_string,
)
from webhook_ingest.ingress.console.security import csrf_matches, same_origin
from webhook_ingest.ingress.tokens import OPERATOR, VIEWER, role_of
from webhook_ingest.shared.dead_letters.model import DeadLetterFilter
from webhook_ingest.shared.settings import Settings

STATIC = ROOT / "ingress" / "console" / "static"
OPERATOR_TOKEN = "operator-token-of-the-unit-tests-0123456789"
VIEWER_TOKEN = "viewer-token-of-the-unit-tests-0123456789"
query_values = st.dictionaries(st.sampled_from([*FIELDS, "before", "junk"]), st.text(max_size=300))


@given(query_values)
def test_any_query_is_a_filter_or_plain_problems(query):
    where, problems = parse_filter(query)
    assert isinstance(where, DeadLetterFilter)
    assert all(isinstance(problem, str) and problem.endswith(".") for problem in problems)
    if not problems:
        assert where.text is None or len(where.text) <= MAX_TEXT
        assert where.since is None or where.since.tzinfo is not None
    before, cursor_problems = parse_before(query)
    assert before is None or before > 0 or cursor_problems == []


@given(query_values)
def test_the_form_values_survive_a_round_trip_through_the_url(query):
    values = form_values(query)
    again = form_values(dict(parse_qsl(query_string(values))))
    assert again == values
    assert parse_filter(values) == parse_filter(again)


def test_a_value_whose_nul_follows_a_space_survives_the_round_trip():
    """Hypothesis found it (helper-23's unit run): a source of `0 \\x00`."""
    values = form_values({"source": "0 \x00"})
    assert form_values(dict(parse_qsl(query_string(values)))) == values


def test_what_a_filter_means():
    where, problems = parse_filter(
        {
            "source": " acme ",
            "status": "all",
            "since": "2026-11-23T10:00",
            "until": "2026-11-23T12:00+01:00",
            "q": "timeout",
            "error_type": "RuntimeError",
        }
    )
    assert problems == []
    assert where == DeadLetterFilter(
        source="acme",
        status=None,
        error_type="RuntimeError",
        since=datetime(2026, 11, 23, 10, tzinfo=UTC),
        until=datetime.fromisoformat("2026-11-23T12:00+01:00"),
        text="timeout",
    )
    assert parse_filter({})[0] == DeadLetterFilter(status="dead")


def test_garbage_is_named_not_applied():
    for query, words in (
        ({"status": "zombie"}, "Status"),
        ({"since": "yesterday"}, "not a date"),
        ({"q": "x" * 5000}, "too long"),
        ({"since": "2026-01-02", "until": "2026-01-01"}, "empty"),
        ({"until": "0001-01-01"}, "out of range"),
    ):
        _, problems = parse_filter(query)
        assert len(problems) == 1 and words in problems[0], query
    assert parse_before({"before": "-3"}) == (None, ["The page link is not valid; showing the newest."])
    assert parse_before({"before": "42"}) == (42, [])


def test_a_post_from_another_site_is_told_apart():
    host = "ingress.internal:8080"
    assert same_origin(CIMultiDict(), host)
    assert same_origin(CIMultiDict({"Origin": "https://ingress.internal:8080", "Sec-Fetch-Site": "same-origin"}), host)
    for headers in (
        {"Origin": "https://attacker.example"},
        {"Origin": "null"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "https://ingress.internal:8081"},
    ):
        assert not same_origin(CIMultiDict(headers), host), headers


def test_csrf_tokens_must_match_and_exist():
    assert csrf_matches("abc", "abc")
    assert not csrf_matches("abc", "abd")
    assert not csrf_matches("", "")
    assert not csrf_matches(None, "abc")
    assert not csrf_matches("abc", None)


def test_each_token_gives_its_role_and_nothing_else_does():
    settings = Settings(WEBHOOK_INGEST_ADMIN_TOKEN=OPERATOR_TOKEN, WEBHOOK_INGEST_VIEWER_TOKEN=VIEWER_TOKEN)
    assert role_of(OPERATOR_TOKEN, settings) == OPERATOR
    assert role_of(VIEWER_TOKEN, settings) == VIEWER
    for wrong in ("", OPERATOR_TOKEN[:-1], OPERATOR_TOKEN + " ", "viewer", OPERATOR_TOKEN.upper()):
        assert role_of(wrong, settings) is None, wrong
    assert role_of("", Settings(WEBHOOK_INGEST_ADMIN_TOKEN=OPERATOR_TOKEN)) is None  # no viewer token: no empty match


def test_the_vendored_htmx_is_the_pinned_file():
    script = STATIC / vendor.HTMX_FILE
    assert hashlib.sha256(script.read_bytes()).hexdigest() == vendor.HTMX_SHA256
    assert sorted(path.name for path in STATIC.glob("*.js")) == [vendor.HTMX_FILE]


def test_make_run_says_where_the_console_is_or_how_to_turn_it_on():
    from webhook_ingest.cli.main import console_line

    on = console_line(Settings(WEBHOOK_INGEST_ADMIN_TOKEN=OPERATOR_TOKEN), "127.0.0.1", 8080)
    assert on.startswith("console: http://127.0.0.1:8080/console/")
    off = console_line(Settings(WEBHOOK_INGEST_ADMIN_TOKEN=""), "127.0.0.1", 8080)
    assert "WEBHOOK_INGEST_ADMIN_TOKEN" in off and "http" not in off


async def test_the_session_cookie_is_httponly_strict_expiring_and_secure_over_https():
    import ssl
    from unittest import mock

    from aiohttp import web
    from aiohttp.test_utils import make_mocked_request
    from aiohttp_session import Session

    from webhook_ingest.ingress.appkeys import settings_key
    from webhook_ingest.ingress.console.security import COOKIE_NAME, cookie_storage
    from webhook_ingest.ingress.console.sessions import ConsoleSessions, console_sessions_key

    settings = Settings(
        WEBHOOK_INGEST_ADMIN_TOKEN=OPERATOR_TOKEN,
        WEBHOOK_INGEST_CONSOLE_SESSION_SECONDS=60,
        WEBHOOK_INGEST_TRUSTED_PROXIES="10.0.0.0/8",
    )
    storage = cookie_storage(settings)

    def request(peer: str, headers: dict | None = None, tls: bool = False, header: str = "X-Forwarded-For"):
        app = web.Application()  # its proxies manage `header` (the proto's header follows it)
        app[settings_key] = settings.model_copy(update={"client_address_header": header})
        app[console_sessions_key] = ConsoleSessions(None, key=bytes(32))
        transport = mock.Mock()
        transport.get_extra_info.side_effect = lambda name, default=None: (peer, 5000) if name == "peername" else None
        return make_mocked_request(
            "GET",
            "/console/",
            headers=headers,
            app=app,
            transport=transport,
            sslcontext=ssl.create_default_context() if tls else None,
        )

    for incoming, secure in (
        (request("192.0.2.1"), False),
        (request("192.0.2.1", tls=True), True),
        (request("10.1.2.3", {"X-Forwarded-Proto": "https"}), True),
        (request("10.1.2.3", {"Forwarded": "for=192.0.2.1;proto=https"}, header="Forwarded"), True),
        (request("192.0.2.1", {"X-Forwarded-Proto": "https"}), False),
    ):  # not a trusted proxy
        session = Session(None, data=None, new=True, max_age=storage.max_age)
        session["role"] = "operator"
        response = web.Response()
        await storage.save_session(incoming, response, session)
        cookie = response.cookies[COOKIE_NAME]
        assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/console/"
        assert bool(cookie["secure"]) is secure and int(cookie["max-age"]) > 60


@pytest.mark.parametrize("variable", ["WEBHOOK_INGEST_ADMIN_TOKEN", "WEBHOOK_INGEST_VIEWER_TOKEN"])
def test_a_token_shorter_than_32_characters_is_refused_saying_why(variable):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as refused:
        Settings(**{variable: "x" * 31})
    assert variable in str(refused.value) and "32 characters" in str(refused.value)
    assert Settings(**{variable: "x" * 32})  # long enough
