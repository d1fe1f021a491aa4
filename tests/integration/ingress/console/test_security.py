"""ingress/console/security and ingress/tokens before authentication: what an
attacker without the token can send to the sign-in page and the bearer API
(issue 21) is refused, never a 500. The real app against the real services."""

import pytest

from tests.support.ingress import running_ingress
from tests.support.preauth import exchange, form_post, login_cookie_and_csrf, preauth_sources, settings_with
from tests.support.tcpproxy import free_port


@pytest.fixture
def sources(tmp_path):
    return preauth_sources(tmp_path)


async def test_malformed_sign_in_and_bearer_input_is_refused_never_a_500(settings, sources, monkeypatch):
    """Bytes that are not UTF-8 in the bearer token or the CSRF header, a form
    in an unknown charset or not UTF-8, a multipart form, an Origin that is not
    a URL: each raised out of the handler (500, and a traceback per request)."""
    async with running_ingress(settings_with(monkeypatch), sources) as client:
        cookie, csrf = await login_cookie_and_csrf(client)
        form = f"csrf_token={csrf}&token=guess".encode()
        multipart = (
            b'--b\r\nContent-Disposition: form-data; name="csrf_token"\r\n\r\n'
            + csrf.encode()
            + b'\r\n--b\r\nContent-Disposition: form-data; name="token"\r\n\r\nguess\r\n--b--\r\n'
        )
        attempts = {
            "bearer": (b"GET /admin/dead-letters HTTP/1.1\nHost: x\nAuthorization: Bearer \xff\xfe\n", b""),
            "csrf header": form_post(cookie, b"application/x-www-form-urlencoded", form, b"X-CSRF-Token: \xff"),
            "charset": form_post(cookie, b"application/x-www-form-urlencoded; charset=no-such-charset", form),
            "not utf-8": form_post(cookie, b"application/x-www-form-urlencoded", form + b"\xff"),
            "multipart": form_post(cookie, b"multipart/form-data; boundary=b", multipart),
            "no boundary": form_post(cookie, b"multipart/form-data", multipart),
            "origin": form_post(cookie, b"application/x-www-form-urlencoded", form, b"Origin: http://[::1"),
        }
        answers = {name: (await exchange(client.port, *attempt))[0] for name, attempt in attempts.items()}
    assert answers == {
        "bearer": 401,
        "csrf header": 403,
        "charset": 403,
        "not utf-8": 403,
        "multipart": 403,
        "no boundary": 403,
        "origin": 403,
    }


async def test_with_postgres_away_the_sign_in_page_is_a_503_not_a_500(settings, sources, monkeypatch):
    """The console answers 503 when Postgres is away (docs/security.md); the
    sign-in page's cookie needs the key kept there, and asking for it only
    when the cookie was written raised past every handler."""
    away = settings_with(monkeypatch, DATABASE_URL=f"postgresql://postgres@127.0.0.1:{free_port()}/nothing")
    async with running_ingress(away, sources) as client:
        page = await client.get("/console/login")
        assert page.status == 503 and "PostgreSQL is unreachable" in await page.text()
        assert (await client.get("/console/", allow_redirects=True)).status == 503
