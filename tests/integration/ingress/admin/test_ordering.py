"""The admin API's ordering keys and the ingress's ordering gauges
(ingress/admin/ordering.py; docs/reference.md §8, §10): a blocked lane is
listed with its age and its dead letter, one lane shown with its rows, the
gauges follow Postgres, and a discard through the API frees and wakes
the lane. Real Postgres and RabbitMQ; the runner (B) stubbed by rows
written as it leaves them."""

import re
from urllib.parse import quote

import aio_pika
import pytest

from tests.support.ingress import running_ingress
from tests.support.ordering_lanes import LANE, block_lane
from tests.support.processes import wait_until
from webhook_ingest.ingress.admin.ordering import set_gauges
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.observability import metrics
from webhook_ingest.shared.ordering import Waiting
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources

TOKEN = "s3cret-admin-token-of-the-ordering-tests"
VIEWER = "viewer-token-of-the-ordering-tests"
OPERATOR = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def admin_settings(settings, monkeypatch) -> Settings:
    monkeypatch.setenv("WEBHOOK_INGEST_ADMIN_TOKEN", TOKEN)
    monkeypatch.setenv("WEBHOOK_INGEST_VIEWER_TOKEN", VIEWER)
    return Settings()


async def test_blocked_lanes_and_one_lane_are_shown_to_a_token_holder(admin_settings):
    dead_letter_id = await block_lane(admin_settings.database_url)
    routed = await block_lane(admin_settings.database_url, "other#billing:inv/7?x", versions=1, minutes_ago=5)
    async with running_ingress(admin_settings, load_sources(None)) as client:
        assert (await client.get("/admin/ordering/blocked")).status == 401
        viewer = {"Authorization": f"Bearer {VIEWER}"}
        listed = await (await client.get("/admin/ordering/blocked", headers=viewer)).json()
        assert [(lane["lane"], lane["dead_letter_id"], lane["waiting"]) for lane in listed] == [
            (LANE, dead_letter_id, 2),  # oldest block first
            ("other#billing:inv/7?x", routed, 0),
        ]
        first = listed[0]
        assert (first["source"], first["route"], first["value"]) == ("acme", None, "obj_1")
        assert 20 * 60 - 5 < first["age_seconds"] < 20 * 60 + 60 and first["since"].endswith("+00:00")
        assert listed[1]["route"] == "billing" and listed[1]["value"] == "inv/7?x"

        only = await (await client.get("/admin/ordering/blocked?source=other", headers=OPERATOR)).json()
        assert [lane["lane"] for lane in only] == ["other#billing:inv/7?x"]
        for bad, code in (
            ("limit=0", "invalid_limit"),
            ("limit=x", "invalid_limit"),
            ("source=a%00b", "invalid_source"),
        ):
            response = await client.get(f"/admin/ordering/blocked?{bad}", headers=OPERATOR)
            assert (response.status, (await response.json())["error"]) == (400, code)

        shown = await (await client.get(f"/admin/ordering/lanes/{quote(LANE, safe='')}", headers=viewer)).json()
        assert (shown["lane"], shown["pending"], shown["seqs_given"], shown["blocked_by"]) == (
            LANE,
            2,
            3,
            dead_letter_id,
        )
        assert [(row["seq"], row["state"], row["dead_letter_id"]) for row in shown["rows"]] == [
            (1, "dead", dead_letter_id),
            (2, "pending", None),
            (3, "pending", None),
        ]
        routed_path = quote("other#billing:inv/7?x", safe="")
        assert (await (await client.get(f"/admin/ordering/lanes/{routed_path}", headers=OPERATOR)).json())[
            "route"
        ] == "billing"
        missing = await client.get("/admin/ordering/lanes/acme%3Anone", headers=OPERATOR)
        assert (missing.status, (await missing.json())["error"]) == (404, "not_found")


async def test_a_discard_through_the_api_frees_the_lane_and_wakes_it(admin_settings):
    dead_letter_id = await block_lane(admin_settings.database_url)
    connection = await aio_pika.connect(admin_settings.amqp_url)
    try:
        channel = await connection.channel()
        queue = await topology.declare_ordering_queue(channel, admin_settings.namespace)
        async with running_ingress(admin_settings, load_sources(None)) as client:
            response = await client.post(f"/admin/dead-letters/{dead_letter_id}/discard", headers=OPERATOR)
            assert response.status == 200 and (await response.json())["status"] == "discarded"
            assert await (await client.get("/admin/ordering/blocked", headers=OPERATOR)).json() == []
            shown = await (await client.get(f"/admin/ordering/lanes/{quote(LANE, safe='')}", headers=OPERATOR)).json()
            assert (shown["pending"], shown["blocked_by"], [row["seq"] for row in shown["rows"]]) == (2, None, [2, 3])
        message = await queue.get(no_ack=True, fail=False)
        assert message is not None and topology.woken_lane(message) == LANE
    finally:
        await connection.close()


async def test_the_ingress_exports_the_ordering_gauges_from_postgres(admin_settings):
    await block_lane(admin_settings.database_url, "gauged:k1", minutes_ago=30)
    await block_lane(admin_settings.database_url, "gauged:k2", minutes_ago=2)
    async with running_ingress(admin_settings, load_sources(None)) as client:

        async def exported() -> bool:
            text = await (await client.get("/metrics")).text()
            return 'webhook_ordering_blocked_keys{source="gauged"} 2.0' in text

        await wait_until(exported, 10, message="the ordering gauges set")
        text = await (await client.get("/metrics")).text()
    assert 'webhook_ordering_waiting_events{source="gauged"} 4.0' in text
    oldest = re.search(r'webhook_ordering_blocked_oldest_seconds\{source="gauged"\} ([0-9.e+]+)', text)
    assert oldest is not None and 30 * 60 - 5 < float(oldest.group(1)) < 31 * 60
    waiting = re.search(r'webhook_ordering_waiting_oldest_seconds\{source="gauged"\} ([0-9.e+]+)', text)
    assert waiting is not None and float(waiting.group(1)) >= 0


async def test_lanes_of_a_source_or_route_the_sources_file_lacks_are_counted(admin_settings):
    """No worker with this file takes them (workers/ordering/runner.py): they
    would wait unseen but for `webhook_ordering_unknown_lanes` (alert
    OrderingLanesUnknown). The demo file has source `demo`, without routes."""
    for lane in ("gone:k1", "gone:k2", "demo#billing:k3", "demo:k4"):
        await block_lane(admin_settings.database_url, lane, versions=2)
    async with running_ingress(admin_settings, load_sources(None)) as client:

        async def exported() -> bool:
            text = await (await client.get("/metrics")).text()
            return 'webhook_ordering_unknown_lanes{source="gone"} 2.0' in text

        await wait_until(exported, 10, message="the unknown lanes counted")
        text = await (await client.get("/metrics")).text()
    assert 'webhook_ordering_unknown_lanes{source="demo"} 1.0' in text  # its route's lane, not its own


def test_a_source_with_nothing_left_goes_to_zero_and_keeps_its_series():
    known = set_gauges({"zeroed": Waiting(3, 10.0, 1, 60.0)}, set())
    assert metrics.ordering_blocked_keys.labels("zeroed")._value.get() == 1
    metrics.ordering_unknown_lanes.labels("zeroed").set(1)
    assert set_gauges({}, known) == {"zeroed"}
    assert metrics.ordering_blocked_keys.labels("zeroed")._value.get() == 0
    assert metrics.ordering_unknown_lanes.labels("zeroed")._value.get() == 0
    assert metrics.ordering_waiting_events.labels("zeroed")._value.get() == 0
    assert metrics.ordering_blocked_oldest.labels("zeroed")._value.get() == 0
