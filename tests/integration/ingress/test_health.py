"""ingress/health: /metrics served only to the networks allowed, /readyz to
anyone (issue 21). The real app against the real services."""

import pytest

from tests.support.ingress import running_ingress
from tests.support.preauth import preauth_sources, settings_with


@pytest.fixture
def sources(tmp_path):
    return preauth_sources(tmp_path)


async def test_metrics_are_served_only_to_the_networks_allowed(settings, sources, monkeypatch):
    """/metrics shares the public port with /webhooks: anyone could read each
    source's deliveries per status as they happen (a payment provider's
    volume, minute by minute), the dead letters open, the incidents."""
    proxied = settings_with(monkeypatch, WEBHOOK_INGEST_TRUSTED_PROXIES="127.0.0.1/32")
    async with running_ingress(proxied, sources) as client:
        internet = await client.get("/metrics", headers={"X-Forwarded-For": "203.0.113.9"})
        assert (internet.status, await internet.json()) == (403, {"error": "forbidden_client_ip"})
        assert (await client.get("/metrics", headers={"X-Forwarded-For": "10.1.2.3"})).status == 200
        assert (await client.get("/metrics")).status == 200  # the peer itself, on loopback
        assert (await client.get("/readyz", headers={"X-Forwarded-For": "203.0.113.9"})).status == 200
    chosen = settings_with(
        monkeypatch, WEBHOOK_INGEST_TRUSTED_PROXIES="127.0.0.1/32", WEBHOOK_INGEST_METRICS_ALLOWED_IPS="198.51.100.0/24"
    )
    async with running_ingress(chosen, sources) as client:
        assert (await client.get("/metrics", headers={"X-Forwarded-For": "198.51.100.7"})).status == 200
        assert (await client.get("/metrics", headers={"X-Forwarded-For": "10.1.2.3"})).status == 403
