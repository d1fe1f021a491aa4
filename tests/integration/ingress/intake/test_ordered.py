"""ingress/intake/ordered.py: an ordered source's events become rows of
their lanes in Postgres before the 200 (docs/design.md, "Ordering keys"),
against the real ingress app, Postgres and RabbitMQ."""

import asyncio
import re
import time

import aio_pika
import aiohttp
import asyncpg
import orjson
import pytest

from tests.support.ingress import queued_events, running_ingress
from tests.support.processes import wait_until
from tests.support.tcpproxy import TcpProxy
from webhook_ingest.shared import signatures
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.sources.model import load_sources
from webhook_ingest.workers.fan_out import route_messages

SECRET = "s"
SOURCES = f"""
[sources.ordered]
scheme = "hmac-sha256"
secrets = ["{SECRET}"]
handler = "inbox"
ordering = {{ key = "body:object", by = "body:created" }}
ignore = {{ type = "ping" }}

[sources.plain]
scheme = "hmac-sha256"
secrets = ["{SECRET}"]
handler = "inbox"

[sources.routed]
scheme = "hmac-sha256"
secrets = ["{SECRET}"]

[[sources.routed.routes]]
name = "billing"
handler = "inbox"
ordering = {{ key = "body:object" }}

[[sources.routed.routes]]
name = "audit"
handler = "inbox"

[[sources.routed.routes]]
name = "invoices"
handler = "inbox"
types = ["invoice.*"]
ordering = {{ key = "body:object" }}
"""


@pytest.fixture
def sources(tmp_path):
    path = tmp_path / "sources.toml"
    path.write_text(SOURCES)
    return load_sources(str(path))


async def post(client, source: str, event_id: str, **fields) -> tuple[int, dict]:
    body = orjson.dumps({"id": event_id, "type": "test.event", **fields})
    headers = signatures.sign("hmac-sha256", body, SECRET) | {"Content-Type": "application/json"}
    response = await client.post(f"/webhooks/{source}", data=body, headers=headers)
    return response.status, await response.json()


async def fetch(database_url: str, sql: str, *args) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetch(sql, *args)
    finally:
        await connection.close()


async def lane_rows(database_url: str) -> list[tuple[str, int, str, str | None]]:
    rows = await fetch(database_url, "SELECT lane, seq, key, route FROM ordered_events ORDER BY lane, seq")
    return [(row["lane"], row["seq"], row["key"], row["route"]) for row in rows]


async def outbox_keys(database_url: str) -> list[str]:
    return [row["key"] for row in await fetch(database_url, "SELECT key FROM outbox ORDER BY id")]


class WakeUps:
    """The lanes woken on NS.ordering, taken off the queue as they come."""

    def __init__(self, amqp_url: str, namespace: str):
        self._amqp_url = amqp_url
        self._queue = topology.ordering_queue(namespace)
        self.lanes: list[str] = []

    async def take(self) -> list[str]:
        connection = await aio_pika.connect(self._amqp_url)
        async with connection:
            channel = await connection.channel()
            queue = await channel.get_queue(self._queue, ensure=False)
            while (message := await queue.get(no_ack=True, fail=False)) is not None:
                self.lanes.append(topology.woken_lane(message))
        return self.lanes

    async def settled(self, count: int) -> list[str]:
        """Once `count` came, and a moment later (a wake-up too many would be published by then)."""

        async def enough() -> bool:
            return len(await self.take()) >= count

        await wait_until(enough, 10, message=f"{count} wake-ups")
        await asyncio.sleep(0.3)
        return await self.take()


def metric(text: str, name: str) -> float:
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
    return float(found[1]) if found else 0.0


async def test_sequential_events_of_a_lane_take_dense_seqs_in_the_order_accepted(settings, sources):
    wake_ups = WakeUps(settings.amqp_url, settings.namespace)
    async with running_ingress(settings, sources) as client:
        for n in range(1, 11):
            assert await post(client, "ordered", f"evt_{n}", object="o1", created=n) == (
                200,
                {"status": "accepted", "key": f"ordered:evt_{n}"},
            )
        assert await post(client, "ordered", "evt_x", object="o2", created=1) == (
            200,
            {"status": "accepted", "key": "ordered:evt_x"},
        )
        assert sorted(await wake_ups.settled(2)) == ["ordered:o1", "ordered:o2"]  # each lane once: idle -> busy
    assert await lane_rows(settings.database_url) == [
        *(("ordered:o1", n, f"ordered:evt_{n}", None) for n in range(1, 11)),
        ("ordered:o2", 1, "ordered:evt_x", None),
    ]
    [lane] = await fetch(settings.database_url, "SELECT * FROM ordering_keys WHERE lane = 'ordered:o1'")
    assert (lane["source"], lane["route"], lane["next_seq"], lane["pending"]) == ("ordered", None, 10, 10)
    [row] = await fetch(settings.database_url, "SELECT by_value, body FROM ordered_events WHERE seq = 3")
    assert row["by_value"] == 3 and orjson.loads(row["body"])["id"] == "evt_3"
    assert await queued_events(settings.amqp_url, settings.namespace) == []  # no broker message, no outbox row
    assert await outbox_keys(settings.database_url) == []


async def test_concurrent_events_of_one_lane_take_dense_seqs_each_once(settings, sources):
    wake_ups = WakeUps(settings.amqp_url, settings.namespace)
    async with running_ingress(settings, sources) as client:
        answers = await asyncio.gather(
            *(post(client, "ordered", f"evt_{n}", object="hot" if n % 4 else f"cold_{n}") for n in range(120))
        )
        assert {status for status, _ in answers} == {200}
        assert len(await wake_ups.settled(31)) == 31  # the hot lane's and each cold one's, once
    rows = await lane_rows(settings.database_url)
    hot = [(seq, key) for lane, seq, key, _ in rows if lane == "ordered:hot"]
    assert [seq for seq, _ in hot] == list(range(1, 91))
    assert sorted(key for _, key in hot) == sorted(f"ordered:evt_{n}" for n in range(120) if n % 4)
    assert sorted(wake_ups.lanes) == sorted(["ordered:hot", *(f"ordered:cold_{n}" for n in range(0, 120, 4))])


async def test_a_lane_is_woken_only_when_it_goes_from_idle_to_busy(settings, sources):
    wake_ups = WakeUps(settings.amqp_url, settings.namespace)
    async with running_ingress(settings, sources) as client:
        for n in range(3):
            assert (await post(client, "ordered", f"evt_a{n}", object="a"))[0] == 200
        assert await wake_ups.settled(1) == ["ordered:a"]
        await drain(settings.database_url, "ordered:a")  # as its holder's completions and release would
        assert (await post(client, "ordered", "evt_a3", object="a"))[0] == 200
        assert await wake_ups.settled(2) == ["ordered:a", "ordered:a"]
        await drain(settings.database_url, "ordered:a", holder=True)  # drained, its holder still holding it
        assert (await post(client, "ordered", "evt_a4", object="a"))[0] == 200
        await drain(settings.database_url, "ordered:a", blocked=True)  # a dead letter blocks it
        assert (await post(client, "ordered", "evt_a5", object="a"))[0] == 200
        await asyncio.sleep(0.3)
        assert await wake_ups.take() == ["ordered:a", "ordered:a"]  # the holder goes on; on-call frees the block
    assert [seq for _, seq, _, _ in await lane_rows(settings.database_url)] == [6]


async def drain(database_url: str, lane: str, holder: bool = False, blocked: bool = False) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute("DELETE FROM ordered_events WHERE lane = $1", lane)
        await connection.execute(
            "UPDATE ordering_keys SET pending = 0, holder = $2, lease_until = $3, blocked_by = $4 WHERE lane = $1",
            lane,
            "w@h:1" if holder else None,
            None if not holder else await connection.fetchval("SELECT now() + interval '1 minute'"),
            7 if blocked else None,
        )
    finally:
        await connection.close()


async def test_with_the_broker_away_an_ordered_source_still_accepts_into_its_lane(settings, sources, monkeypatch):
    """Its events wait in Postgres, not in the outbox, and its wake-up is counted as lost (the watchdog
    finds the lane); an unordered source goes to the outbox as before."""
    monkeypatch.setenv("AMQP_URL", "amqp://guest:guest@127.0.0.1:1/")
    async with running_ingress(type(settings)(), sources, wait_ready=False) as client:
        before = metric(await (await client.get("/metrics")).text(), "webhook_ordering_wake_ups_failed_total")
        assert await post(client, "ordered", "evt_1", object="o1") == (
            200,
            {"status": "accepted", "key": "ordered:evt_1"},
        )
        assert await post(client, "plain", "evt_1", object="o1") == (200, {"status": "accepted", "key": "plain:evt_1"})
        after = metric(await (await client.get("/metrics")).text(), "webhook_ordering_wake_ups_failed_total")
    assert after == before + 1
    assert await lane_rows(settings.database_url) == [("ordered:o1", 1, "ordered:evt_1", None)]
    assert await outbox_keys(settings.database_url) == ["plain:evt_1"]


async def test_with_postgres_cut_an_ordered_source_answers_503_and_writes_nothing(settings, sources, monkeypatch):
    with TcpProxy("127.0.0.1", 5432) as proxy:
        monkeypatch.setenv("DATABASE_URL", proxy.url_for(settings.database_url))
        async with running_ingress(type(settings)(), sources) as client:
            assert (await post(client, "ordered", "evt_1", object="o1"))[0] == 200
            proxy.cut()
            response = await client.post(
                "/webhooks/ordered",
                data=(body := orjson.dumps({"id": "evt_2", "object": "o1"})),
                headers=signatures.sign("hmac-sha256", body, SECRET),
            )
            assert (response.status, await response.json()) == (503, {"error": "unavailable"})
            assert int(response.headers["Retry-After"]) > 0
            assert (await post(client, "routed", "evt_3", object="o1"))[0] == 503  # its billing route is ordered
            assert await post(client, "plain", "evt_4") == (200, {"status": "accepted", "key": "plain:evt_4"})
            proxy.restore()
            assert (await post(client, "ordered", "evt_5", object="o1"))[0] == 200
    assert await lane_rows(settings.database_url) == [
        ("ordered:o1", 1, "ordered:evt_1", None),
        ("ordered:o1", 2, "ordered:evt_5", None),  # dense: the 503's seq was never taken
    ]
    assert [event.key for event in await queued_events(settings.amqp_url, settings.namespace)] == ["plain:evt_4"]


async def test_ignored_events_write_no_row_and_a_copy_is_a_row_of_its_own(settings, sources):
    """The ignore rules come first, as for any source; a copy is not deduplicated at the door
    (the runner's per-event claim makes it a duplicate in its turn)."""
    async with running_ingress(settings, sources) as client:
        assert await post(client, "ordered", "evt_0", type="ping", object="o1") == (
            200,
            {"status": "ignored", "key": "ordered:evt_0", "rule": "type=ping"},
        )
        for _ in range(2):
            assert await post(client, "ordered", "evt_1", object="o1") == (
                200,
                {"status": "accepted", "key": "ordered:evt_1"},
            )
    assert await lane_rows(settings.database_url) == [
        ("ordered:o1", 1, "ordered:evt_1", None),
        ("ordered:o1", 2, "ordered:evt_1", None),
    ]


async def test_an_event_whose_key_resolves_to_nothing_takes_the_unordered_path_and_is_counted(settings, sources):
    async with running_ingress(settings, sources) as client:
        series = 'webhook_ordering_unkeyed_total{source="ordered"}'
        before = metric(await (await client.get("/metrics")).text(), series)
        assert await post(client, "ordered", "evt_1") == (200, {"status": "accepted", "key": "ordered:evt_1"})
        assert await post(client, "ordered", "evt_2", object="") == (
            200,
            {"status": "accepted", "key": "ordered:evt_2"},
        )
        assert metric(await (await client.get("/metrics")).text(), series) == before + 2
    assert await lane_rows(settings.database_url) == []
    queued = await queued_events(settings.amqp_url, settings.namespace)
    assert sorted(event.key for event in queued) == ["ordered:evt_1", "ordered:evt_2"]


async def test_a_routed_event_is_a_row_per_ordered_route_and_one_message_for_the_unordered(settings, sources):
    async with running_ingress(settings, sources) as client:
        assert (await post(client, "routed", "evt_1", object="o1"))[0] == 200  # billing and audit take it
        assert (await post(client, "routed", "evt_2", type="invoice.paid", object="o1"))[0] == 200  # all three
    assert await lane_rows(settings.database_url) == [
        ("routed#billing:o1", 1, "routed:evt_1#billing", "billing"),
        ("routed#billing:o1", 2, "routed:evt_2#billing", "billing"),
        ("routed#invoices:o1", 1, "routed:evt_2#invoices", "invoices"),
    ]
    queued = {event.key: event for event in await queued_events(settings.amqp_url, settings.namespace)}
    assert {key: event.laned_routes for key, event in queued.items()} == {
        "routed:evt_1": ("billing",),
        "routed:evt_2": ("billing", "invoices"),
    }
    fanned_out = [m.key for key in sorted(queued) for m in route_messages(sources["routed"], queued[key])]
    assert fanned_out == ["routed:evt_1#audit", "routed:evt_2#audit"]  # the ordered routes run in their lanes only


async def test_three_ingress_processes_sequence_one_lane_in_acceptance_order(settings, fleet, tmp_path):
    """3 processes x 3 senders, each sending one after another on one lane: the seqs are dense, and a
    request answered before another was sent is always earlier in the lane, whichever process took them."""
    path = tmp_path / "sources.toml"
    path.write_text(SOURCES)
    urls = [fleet.ingress(env={"WEBHOOK_INGEST_SOURCES": str(path)})[1] for _ in range(3)]
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(until_ready(session, url) for url in urls))
        spans = await asyncio.gather(*(send(session, urls[n % 3], f"s{n}", 15) for n in range(9)))
    requests = [request for sender in spans for request in sender]
    seqs = {key: seq for lane, seq, key, _ in await lane_rows(settings.database_url) if lane == "ordered:hot"}
    assert sorted(seqs.values()) == list(range(1, len(requests) + 1))
    inverted = [
        (earlier[0], later[0])
        for earlier in requests
        for later in requests
        if earlier[2] < later[1] and seqs[earlier[0]] > seqs[later[0]]
    ]
    assert inverted == []


async def until_ready(session: aiohttp.ClientSession, url: str) -> None:
    async def ready() -> bool:
        try:
            async with session.get(f"{url}/readyz") as response:
                return response.status == 200
        except aiohttp.ClientError:
            return False

    await wait_until(ready, 60, interval=0.1, message=f"{url} ready")


async def send(session: aiohttp.ClientSession, url: str, sender: str, count: int) -> list[tuple[str, float, float]]:
    """Each event sent once the previous one was answered: (key, sent, answered) for each."""
    sent = []
    for n in range(count):
        body = orjson.dumps({"id": f"{sender}_{n}", "object": "hot"})
        started = time.monotonic()
        async with session.post(
            f"{url}/webhooks/ordered", data=body, headers=signatures.sign("hmac-sha256", body, SECRET)
        ) as response:
            assert response.status == 200, await response.text()
        sent.append((f"ordered:{sender}_{n}", started, time.monotonic()))
    return sent


async def test_a_by_value_numeric_cannot_hold_fails_no_other_request(settings, sources):
    """`by = "body:created"` reads a numeric string as its number
    (`by_number`); storable_json refuses such a JSON number (1e-20000: more
    than 16383 digits after the point), not a string. Decimal("1e-20000") is
    finite, so it reaches the insert, which asyncpg cannot encode: the one
    statement of up to 100 requests fails, and each is answered 503 — every
    ordered source's request in flight, again at each of the sender's retries
    of that one event. An unreadable `by` is NULL (after the lane's dated
    rows, never stale), as for any other."""
    async with running_ingress(settings, sources) as client:
        answers = await asyncio.gather(
            post(client, "ordered", "evt_odd", object="o1", created="1e-20000"),
            *(post(client, "ordered", f"evt_{n}", object=f"o{n % 7}", created=n) for n in range(40)),
        )
    statuses = [status for status, _ in answers]
    assert statuses == [200] * 41, {status: statuses.count(status) for status in statuses}
