"""The console's own defences (ingress/console/security.py): the origin and
CSRF checks, and the session cookie's attributes."""

from multidict import CIMultiDict

from webhook_ingest.ingress.console.security import csrf_matches, same_origin
from webhook_ingest.shared.settings import Settings

OPERATOR_TOKEN = "operator-token-of-the-unit-tests-0123456789"


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
