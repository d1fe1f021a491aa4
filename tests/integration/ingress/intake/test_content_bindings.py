"""The content bindings (ingress/intake/content_bindings.py) against a
Redis that answers, but late: a loaded host, not an outage."""

import hashlib
import hmac
import json
from urllib.parse import urlsplit

import pytest

from tests.support.ingress import queued_events, running_ingress
from tests.support.signing import PROVIDERS
from tests.support.tcpproxy import TcpProxy
from webhook_ingest.ingress.intake import content_bindings
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources

GITHUB_SECRET = PROVIDERS["github"].source_secret
# as late as the binding script's answer came on a host at load 13-18 (2 cores, the suite's four
# processes and a benchmark beside it): 41 of 600 calls over 75 ms, the slowest 279 ms
LATE_SECONDS = 0.3


@pytest.fixture
def sources(tmp_path):
    path = tmp_path / "sources.toml"
    path.write_text(f'[sources.github]\nscheme = "github"\nsecrets = ["{GITHUB_SECRET}"]\nhandler = "inbox"\n')
    return load_sources(str(path))


def github_signed(body: bytes, delivery: str, event: str) -> dict[str, str]:
    digest = hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()
    return {
        "X-Hub-Signature-256": f"sha256={digest}",
        "X-GitHub-Delivery": delivery,
        "X-GitHub-Event": event,
        "Content-Type": "application/json",
    }


async def posted(client, requests: list[tuple[bytes, str]]) -> list[tuple[int, dict]]:
    return [
        (response.status, await response.json())
        for response in [
            await client.post("/webhooks/github", data=body, headers=github_signed(body, delivery, "issues"))
            for body, delivery in requests
        ]
    ]


async def test_a_body_resent_with_a_fresh_delivery_is_a_duplicate_when_redis_answers_late(
    settings, sources, monkeypatch
):
    """A late answer is not Redis away (docs/reference.md §5): on a loaded
    host the binding was skipped and `d-2` accepted, a second event for
    content signed once (tests/integration/shared/event/test_ids.py, once in
    CI with four test processes)."""
    redis_url = urlsplit(settings.redis_urls[0])
    body = json.dumps({"action": "opened", "issue": {"number": 1347}}).encode()
    with TcpProxy(redis_url.hostname or "127.0.0.1", redis_url.port or 6379, latency=LATE_SECONDS) as late:
        monkeypatch.setenv("REDIS_URLS", late.url_for(settings.redis_urls[0]))
        async with running_ingress(Settings(), sources) as client:
            replies = await posted(client, [(body, "d-1"), (body, "d-2")])
    assert replies == [
        (200, {"status": "accepted", "key": "github:d-1"}),
        (200, {"status": "duplicate", "key": "github:d-1"}),
    ]
    assert sorted(event.key for event in await queued_events(settings.amqp_url, settings.namespace)) == ["github:d-1"]


async def test_with_redis_black_holed_a_delivery_still_takes_the_normal_path(settings, sources, monkeypatch):
    """The longer wait is for a late answer; none at all is Redis away: the
    event is accepted, not lost (docs/reference.md §5)."""
    redis_url = urlsplit(settings.redis_urls[0])
    failed: list[dict] = []
    warning = content_bindings.log.warning
    monkeypatch.setattr(
        content_bindings.log, "warning", lambda event, **fields: failed.append(fields) or warning(event, **fields)
    )
    first, second = (json.dumps({"action": "opened", "issue": {"number": n}}).encode() for n in (1, 2))
    with TcpProxy(redis_url.hostname or "127.0.0.1", redis_url.port or 6379) as hole:
        monkeypatch.setenv("REDIS_URLS", hole.url_for(settings.redis_urls[0]))
        async with running_ingress(Settings(), sources) as client:
            hole.stall()
            replies = await posted(client, [(first, "d-1"), (second, "d-2")])
    assert replies == [
        (200, {"status": "accepted", "key": "github:d-1"}),
        (200, {"status": "accepted", "key": "github:d-2"}),
    ]
    assert failed and all("Timeout" in fields["error"] for fields in failed)
