"""Incidents (issue 25, item 1): failures of the real FailurePolicy grouped
by source, handler and error fingerprint in the real Postgres; opened,
acknowledged, resolved by hand or by quiet, reopened by a new failure."""

import asyncio
import json

import aio_pika
import asyncpg
import pytest
from click.testing import CliRunner

from tests.support.console import csrf_of, signed_in
from tests.support.events import make_event
from tests.support.ingress import running_ingress
from tests.support.processes import wait_until
from webhook_ingest.cli.main import main
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.incidents.store import IncidentNotFound, IncidentStore
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources, parse_source
from webhook_ingest.workers.claim.retry import FailurePolicy
from webhook_ingest.workers.claim.states import Outcome
from webhook_ingest.workers.failures.incident_counts import IncidentCounts

OPERATOR = "operator-token-for-the-incident-tests-0123"
VIEWER = "viewer-token-for-the-incident-tests-012345"


def source(max_attempts: int, handler: str = "inbox"):
    return parse_source(
        "acme",
        {"scheme": "github", "secrets": ["s"], "handler": handler, "retry_delays": [30], "max_attempts": max_attempts},
    )


@pytest.fixture
async def pool(settings):
    pool = await asyncpg.create_pool(settings.database_url, min_size=0, max_size=2)
    yield pool
    await pool.close()


@pytest.fixture
async def counts(pool):
    """A worker's incident counts, written by their task as in a worker."""
    counts = IncidentCounts(pool)
    task = asyncio.create_task(counts.run())
    yield counts
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


@pytest.fixture
async def channel(settings):
    connection = await aio_pika.connect(settings.amqp_url)
    channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
    await topology.declare_retry_queue(channel, settings.namespace, 30)
    yield channel
    await channel.queue_delete(topology.retry_queue(settings.namespace, 30))
    await connection.close()


async def test_an_outage_is_one_incident_holding_its_events_and_their_dead_letters(settings, pool, channel, counts):
    failures = FailurePolicy(channel, pool, settings.namespace, counts)
    for n in range(5):  # one downstream timing out, each event naming its own order and URL
        timeout = TimeoutError(f"POST https://crm.example/orders/{9000 + n} timed out after {30 + n} s")
        outcome = await failures.fail(make_event("acme", f"evt_{n}"), source(max_attempts=1 + n % 2), timeout)
        assert outcome is (Outcome.DEAD if n % 2 == 0 else Outcome.RETRIED)
    await failures.fail(make_event("acme", "evt_other"), source(1), KeyError("customer"))  # another cause
    await failures.fail(
        make_event("acme", "evt_0"),
        source(1, handler="billing:on_event"),
        TimeoutError("POST https://crm.example/orders/1 timed out after 3 s"),
    )  # another handler
    await counts.flush(10)

    store = IncidentStore(pool)
    incidents = await store.newest_first()
    assert sorted((i["handler"], i["error_type"], i["failures"], i["dead_letters"], i["state"]) for i in incidents) == [
        ("billing:on_event", "TimeoutError", 1, 1, "open"),
        ("inbox", "KeyError", 1, 1, "open"),
        ("inbox", "TimeoutError", 5, 3, "open"),
    ]
    [outage] = [i for i in incidents if i["handler"] == "inbox" and i["error_type"] == "TimeoutError"]
    assert outage["error_pattern"] == "POST <url> timed out after <n> s"
    events = await store.events(outage["id"])
    assert sorted(e["event_id"] for e in events) == [f"evt_{n}" for n in range(5)]
    assert len(await store.open_dead_letter_ids(outage["id"])) == 3
    assert [h["state"] for h in await store.history(outage["id"])] == ["open"]


async def test_a_retry_is_counted_after_its_run_even_while_its_incident_row_is_busy(settings, pool, channel, counts):
    """Counting a retry into its incident is bookkeeping, off the run: the
    run settles while the incident's row is held elsewhere (another worker's
    count, a partitioned worker's transaction), and the count is written
    once the row is free, not skipped."""
    failures = FailurePolicy(channel, pool, settings.namespace, counts)
    boom = RuntimeError("downstream answered 503")
    assert await failures.fail(make_event("acme", "evt_1"), source(3), boom) is Outcome.RETRIED
    await counts.flush(10)
    store = IncidentStore(pool)
    [incident] = await store.newest_first()
    holder = await asyncpg.connect(settings.database_url)
    try:
        async with holder.transaction():
            await holder.execute("SELECT FROM incidents WHERE id = $1 FOR UPDATE", incident["id"])
            assert await failures.fail(make_event("acme", "evt_2"), source(3), boom) is Outcome.RETRIED
    finally:
        await holder.close()

    async def counted() -> bool:
        return (await store.get(incident["id"]))["failures"] == 2

    await wait_until(counted, 10, message="the second retry counted in its incident")


async def test_an_incident_is_acknowledged_resolved_and_reopened_by_a_new_failure(settings, pool):
    failures = FailurePolicy(None, pool, settings.namespace)  # dead letters need no channel
    boom = RuntimeError("downstream answered 503")
    await failures.fail(make_event("acme", "evt_1"), source(1), boom)
    store = IncidentStore(pool)
    [incident] = await store.newest_first()

    assert await store.acknowledge(incident["id"], "operator:alice")
    assert not await store.acknowledge(incident["id"], "operator:bob")  # already
    acknowledged = await store.get(incident["id"])
    assert (acknowledged["state"], acknowledged["acknowledged_by"]) == ("acknowledged", "operator:alice")
    assert await store.resolve(incident["id"], "operator:alice")
    assert not await store.resolve(incident["id"], "operator:alice")

    await failures.fail(make_event("acme", "evt_2"), source(1), RuntimeError("downstream answered 502"))
    reopened = await store.get(incident["id"])
    assert (reopened["state"], reopened["failures"], reopened["acknowledged_by"]) == ("open", 2, None)
    assert [(h["state"], h["actor"]) for h in await store.history(incident["id"])] == [
        ("open", "failure"),
        ("acknowledged", "operator:alice"),
        ("resolved", "operator:alice"),
        ("open", "failure"),
    ]
    with pytest.raises(IncidentNotFound):
        await store.acknowledge(424242, "operator:alice")


async def test_a_quiet_incident_resolves_itself(settings, pool):
    failures = FailurePolicy(None, pool, settings.namespace)
    await failures.fail(make_event("acme", "evt_1"), source(1), RuntimeError("old trouble"))
    await failures.fail(make_event("acme", "evt_2"), source(1), ValueError("fresh trouble"))
    store = IncidentStore(pool)
    async with pool.acquire() as connection:
        await connection.execute(
            "UPDATE incidents SET last_seen = now() - interval '31 minutes' WHERE error_type = 'RuntimeError'"
        )
    [resolved] = await store.resolve_quiet(30 * 60)
    quiet = await store.get(resolved)
    assert (quiet["error_type"], quiet["state"], quiet["resolved_by"]) == ("RuntimeError", "resolved", "auto")
    assert await store.unresolved_counts() == {"open": 1, "acknowledged": 0}


def incidents_cli(*args: str):
    return CliRunner().invoke(main, ["incidents", *args])


async def two_dead_letters_in_one_incident(settings, pool) -> int:
    failures = FailurePolicy(None, pool, settings.namespace)
    for n in (1, 2):
        await failures.fail(make_event("acme", f"evt_{n}"), source(1), RuntimeError(f"order {n} refused"))
    [incident] = await IncidentStore(pool).newest_first()
    return incident["id"]


async def test_the_cli_lists_shows_acknowledges_and_discards_an_incident(settings, pool):
    incident_id = await two_dead_letters_in_one_incident(settings, pool)
    table = await asyncio.to_thread(incidents_cli, "list")
    assert table.exit_code == 0 and "RuntimeError: order <n> refused" in table.stdout
    [listed] = json.loads((await asyncio.to_thread(incidents_cli, "list", "--json")).stdout)
    assert (listed["id"], listed["state"], listed["failures"], listed["dead_letters"]) == (incident_id, "open", 2, 2)
    acked = await asyncio.to_thread(incidents_cli, "ack", str(incident_id))
    assert acked.stdout.strip() == f"incident {incident_id} acknowledged"
    shown = json.loads((await asyncio.to_thread(incidents_cli, "show", str(incident_id), "--json")).stdout)
    assert shown["state"] == "acknowledged" and shown["acknowledged_by"].startswith("cli")
    assert sorted(event["event_id"] for event in shown["events"]) == ["evt_1", "evt_2"]
    discarded = await asyncio.to_thread(incidents_cli, "discard", str(incident_id))
    assert discarded.stdout.strip() == "discarded 2"
    assert await IncidentStore(pool).open_dead_letter_ids(incident_id) == []
    for bad, message in (
        ("999", "error: there is no incident 999"),
        ("x", "error: invalid incident id 'x': ids are positive integers"),
    ):
        refused = await asyncio.to_thread(incidents_cli, "ack", bad)
        assert (refused.exit_code, refused.stderr.strip()) == (2, message)


async def test_the_admin_api_serves_incidents_to_the_operator_and_reads_to_the_viewer(settings, pool, monkeypatch):
    incident_id = await two_dead_letters_in_one_incident(settings, pool)
    monkeypatch.setenv("WEBHOOK_INGEST_ADMIN_TOKEN", OPERATOR)
    monkeypatch.setenv("WEBHOOK_INGEST_VIEWER_TOKEN", VIEWER)
    operator, viewer = ({"Authorization": f"Bearer {token}"} for token in (OPERATOR, VIEWER))
    async with running_ingress(Settings(), load_sources(None)) as client:
        [listed] = await (await client.get("/admin/incidents", headers=viewer)).json()
        assert (listed["id"], listed["error_pattern"]) == (incident_id, "order <n> refused")
        shown = await (await client.get(f"/admin/incidents/{incident_id}", headers=viewer)).json()
        assert len(shown["events"]) == 2 and shown["history"][0]["state"] == "open"
        assert (await client.post(f"/admin/incidents/{incident_id}/acknowledge", headers=viewer)).status == 403
        acked = await client.post(f"/admin/incidents/{incident_id}/acknowledge", headers=operator)
        assert acked.status == 200 and (await acked.json())["acknowledged_by"] == "operator (admin-api)"
        again = await client.post(f"/admin/incidents/{incident_id}/acknowledge", headers=operator)
        assert again.status == 409
        discarded = await client.post(f"/admin/incidents/{incident_id}/discard", headers=operator)
        assert len((await discarded.json())["discarded"]) == 2
        assert (await client.post(f"/admin/incidents/{incident_id}/resolve", headers=operator)).status == 200
        for path, status in (
            ("/admin/incidents/424242", 404),
            ("/admin/incidents/x", 400),
            ("/admin/incidents?state=zombie", 400),
            ("/admin/incidents?limit=" + "9" * 30, 400),
        ):
            assert (await client.get(path, headers=viewer)).status == status, path
    async with pool.acquire() as connection:
        statuses = await connection.fetch("SELECT status FROM dead_letters")
    assert [row["status"] for row in statuses] == ["discarded", "discarded"]


async def test_the_console_puts_open_incidents_first_and_discards_one_through_a_bulk_action(
    settings, pool, monkeypatch
):
    incident_id = await two_dead_letters_in_one_incident(settings, pool)
    monkeypatch.setenv("WEBHOOK_INGEST_ADMIN_TOKEN", OPERATOR)
    async with running_ingress(Settings(), load_sources(None)) as client:
        csrf = await signed_in(client, OPERATOR)
        home = await (await client.get("/console/")).text()
        assert home.index("Incidents") < home.index("Open dead letters")
        assert f'href="/console/incidents/{incident_id}"' in home and "order &lt;n&gt; refused" in home
        acked = await client.post(f"/console/incidents/{incident_id}/acknowledge", data={"csrf_token": csrf})
        assert acked.status == 200 and "Acknowledged: on-call is on it." in await acked.text()
        bulk = await client.post(
            f"/console/incidents/{incident_id}/bulk", data={"csrf_token": csrf, "action": "discard"}
        )
        page = await bulk.text()
        assert f"the open dead letters of incident {incident_id}" in page and "<strong>2</strong>" in page
        bulk_id = str(bulk.url).rsplit("/", 1)[1]
        started = await client.post(f"/console/bulk/{bulk_id}/start", data={"csrf_token": csrf_of(page), "rate": "50"})
        assert started.status == 200
        for _ in range(100):
            if await IncidentStore(pool).open_dead_letter_ids(incident_id) == []:
                break
            await asyncio.sleep(0.1)
        assert await IncidentStore(pool).open_dead_letter_ids(incident_id) == []
        incident_page = await (await client.get(f"/console/incidents/{incident_id}")).text()
        assert "acknowledged by operator (console)" in incident_page and "(discarded)" in incident_page
        assert (await client.get("/console/incidents/424242")).status == 404
