"""ingress/client_address behind a trusted proxy: who a client is (an IPv6
client is its /64) and whether it came over HTTPS, read from the header the
proxy manages (issue 21). The real app against the real services."""

import pytest

from tests.support.ingress import running_ingress
from tests.support.preauth import login_cookie_and_csrf, preauth_sources, settings_with
from webhook_ingest.ingress.intake.failure_budget import FAILURES_BURST


@pytest.fixture
def sources(tmp_path):
    return preauth_sources(tmp_path)


async def test_the_addresses_of_one_ipv6_network_are_one_client(settings, sources, monkeypatch):
    """Anyone with IPv6 holds a /64 at least (2^64 addresses) and may send from
    any of them: counted per address, the failure budget and the sign-in
    throttle never refused one such client."""
    proxied = settings_with(monkeypatch, WEBHOOK_INGEST_TRUSTED_PROXIES="127.0.0.1/32")
    async with running_ingress(proxied, sources) as client:
        failures = [
            (
                await client.post("/webhooks/open", data=b"{}", headers={"X-Forwarded-For": f"2001:db8:1:2::{n:x}"})
            ).status
            for n in range(1, FAILURES_BURST + 4)
        ]
        neighbour = await client.post("/webhooks/open", data=b"{}", headers={"X-Forwarded-For": "2001:db8:1:3::1"})
        _, csrf = await login_cookie_and_csrf(client)
        sign_ins = [
            (
                await client.post(
                    "/console/login",
                    data={"csrf_token": csrf, "token": "guess"},
                    headers={"X-Forwarded-For": f"2001:db8:7:7:{n:x}::1"},
                )
            ).status
            for n in range(1, 11)
        ]
    assert failures == [401] * FAILURES_BURST + [429] * 3
    assert neighbour.status == 401  # another /64 is another client
    assert sign_ins == [401] * 5 + [429] * 5


@pytest.mark.parametrize("header", ["X-Forwarded-For", "Forwarded"])
async def test_the_secure_cookie_follows_the_header_the_proxy_manages(settings, sources, monkeypatch, header):
    """`came_over_https` read `Forwarded` (its leftmost element: the client's)
    before `X-Forwarded-Proto`, whichever header the proxy manages."""
    proxied = settings_with(
        monkeypatch, WEBHOOK_INGEST_TRUSTED_PROXIES="127.0.0.1/32", WEBHOOK_INGEST_CLIENT_ADDRESS_HEADER=header
    )
    if header == "X-Forwarded-For":  # nginx: X-Forwarded-Proto its own, a client's Forwarded passed through
        over_https = {"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https", "Forwarded": "proto=http"}
        over_http = {"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "http", "Forwarded": "proto=https"}
    else:  # a proxy appending its Forwarded element, a client's X-Forwarded-Proto passed through
        over_https = {
            "Forwarded": "for=198.51.100.1;proto=http, for=203.0.113.9;proto=https",
            "X-Forwarded-Proto": "http",
        }
        over_http = {
            "Forwarded": "for=198.51.100.1;proto=https, for=203.0.113.9;proto=http",
            "X-Forwarded-Proto": "https",
        }
    async with running_ingress(proxied, sources) as client:
        secure = (await client.get("/console/login", headers=over_https)).headers["Set-Cookie"]
        client.session.cookie_jar.clear()
        plain = (await client.get("/console/login", headers=over_http)).headers["Set-Cookie"]
    assert "; Secure" in secure and "; Secure" not in plain
