"""ingress/intake/refusals: a client refused again and again is logged once a
minute, and counted every time (issue 21). The real app against the real services."""

import re
from collections import Counter

import pytest

from tests.support.ingress import running_ingress
from tests.support.logs import captured_logs
from tests.support.preauth import preauth_sources, settings_with
from webhook_ingest.ingress.intake.failure_budget import FAILURES_BURST


@pytest.fixture
def sources(tmp_path):
    return preauth_sources(tmp_path)


async def test_a_client_refused_again_and_again_is_logged_once_a_minute(settings, sources, monkeypatch):
    """A client over its failure budget, or outside a source's allowlist, was
    logged on every refused request: no budget bounds those (the 429 and the
    403 are answered before anything is spent), so one client wrote a log
    line per few bytes sent, for ever. The counters count every one."""
    async with running_ingress(settings_with(monkeypatch), sources) as client:
        before = await refusals_counted(client)
        answered: Counter = Counter()
        with captured_logs() as logs:
            for source, times in (("open", FAILURES_BURST + 30), ("office", 30)):
                for _ in range(times):
                    status = (await client.post(f"/webhooks/{source}", data=b"{}")).status
                    answered[(source, str(status))] += status in (403, 429)
        after = await refusals_counted(client)
    events = Counter(line["event"] for line in logs)
    assert events["too_many_failures"] == 1 and events["forbidden_source_ip"] == 1
    # the budget refills a failure a second: on a slow host the 50 requests earn one back
    assert answered[("office", "403")] == 30 and answered[("open", "429")] >= 25
    assert after - before == +answered


async def refusals_counted(client) -> Counter:
    """webhook_ingress_requests_total of the 403s and 429s, by (source, status): the process's counters."""
    text = await (await client.get("/metrics")).text()
    found = re.findall(r'webhook_ingress_requests_total\{source="(\w+)",status="(403|429)"\} ([0-9.]+)', text)
    return Counter({(source, status): int(float(value)) for source, status, value in found})
