"""Searching the event archive (issue 22, item 4): the admin API's
GET /admin/events and /admin/events/{key}, and `webhook-ingest events
list|show`, which answer the same documents. Real Postgres; the archive is
written as the ingress and the workers write it (ArchiveStore)."""

import asyncio
import base64
import dataclasses
import json
import re
from datetime import UTC, datetime, timedelta

import asyncpg
import orjson
import pytest
from click.testing import CliRunner

from tests.support.dead_letters import failure
from tests.support.events import make_event
from tests.support.ingress import console_login, running_ingress
from webhook_ingest.cli.main import main
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.archive.search import COUNT_CAP, EventFilter, SourceRoutes
from webhook_ingest.shared.archive.store import SQL, ArchiveStore
from webhook_ingest.shared.dead_letters.model import record_dead_letter
from webhook_ingest.shared.event.message import new_arrival
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources

TOKEN = "s3cret-admin-token-of-the-archive-search-tests"
VIEWER = "s3cret-viewer-token-of-the-archive-search-tests"
NOW = datetime.now(UTC).replace(microsecond=0)


@pytest.fixture
def admin_settings(settings, monkeypatch) -> Settings:
    monkeypatch.setenv("WEBHOOK_INGEST_ADMIN_TOKEN", TOKEN)
    monkeypatch.setenv("WEBHOOK_INGEST_VIEWER_TOKEN", VIEWER)
    return Settings()


def event(source: str, event_id: str, minutes_ago: int, kind: str, **payload):
    body = orjson.dumps({"id": event_id, "type": kind, **payload})
    made = make_event(source, event_id, {"type": kind, **payload})
    return dataclasses.replace(made, body=body, received_at=(NOW - timedelta(minutes=minutes_ago)).timestamp())


@pytest.fixture
async def archived(admin_settings):
    """stripe: three invoices (one processed, one dead, one still queued with its
    key's lease held), a copy and a conflict; github: a push."""
    paid = event("stripe", "evt_1", 50, "invoice.paid", customer="cus_123")
    failed = event("stripe", "evt_2", 40, "invoice.paid", customer="cus_456")
    running = event("stripe", "evt_3", 30, "invoice.created", customer="cus_123")
    copy = dataclasses.replace(paid, received_at=(NOW - timedelta(minutes=20)).timestamp())
    other = dataclasses.replace(event("stripe", "evt_1", 10, "invoice.paid", customer="cus_999"))
    push = event("github", "d/1", 5, "push", ref="main")
    connection = await asyncpg.connect(admin_settings.database_url)
    try:
        store = ArchiveStore(connection)
        await store.keep({"stripe": timedelta(days=7), "github": timedelta(days=7)})
        await store.write_arrivals(
            [
                archive.arrival_row(e, json.loads(e.body)["type"], '{"x-test": "1"}', archive.QUEUED)
                for e in (paid, failed, running, copy, other, push)
            ]
        )
        at = NOW.timestamp()
        await store.write_outcomes(
            [
                archive.outcome_row(paid, archive.PROCESSED, at),
                archive.outcome_row(copy, archive.DUPLICATE, at),
                archive.outcome_row(failed, archive.DEAD, at, "RuntimeError: 500"),
                archive.outcome_row(other, archive.CONFLICT, at),
                archive.outcome_row(push, archive.PROCESSED, at),
            ]
        )
        await connection.execute(
            "INSERT INTO key_fences (key, token, lease_until) VALUES ($1, 1, now() + interval '1 hour')", running.key
        )
        await connection.execute(
            "INSERT INTO processed_events (key, source, event_id, payload_sha256, attempts)"
            " VALUES ($1, 'stripe', 'evt_1', $2, 1)",
            paid.key,
            paid.payload_sha256,
        )
        dead_letter = await record_dead_letter(connection, failed, [failure(1)])
    finally:
        await connection.close()
    return {"dead_letter": dead_letter}


def events(*args: str):
    return CliRunner().invoke(main, ["events", *args])


async def get(client, path: str, token: str = TOKEN):
    response = await client.get(path, headers={"Authorization": f"Bearer {token}"})
    return response.status, await response.json()


async def test_a_search_filters_newest_first_and_counts(admin_settings, archived):
    async with running_ingress(admin_settings, load_sources(None)) as client:

        async def keys(query: str) -> list[tuple[str, str]]:
            status, page = await get(client, f"/admin/events?{query}")
            assert status == 200, page
            assert page["count"] == len(page["events"])
            return [(row["key"], row["status"]) for row in page["events"]]

        assert await keys("") == [
            ("github:d/1", "processed"),
            ("stripe:evt_1", "conflict"),
            ("stripe:evt_1", "duplicate"),
            ("stripe:evt_3", "processing"),
            ("stripe:evt_2", "dead"),
            ("stripe:evt_1", "processed"),
        ]
        assert await keys("source=github") == [("github:d/1", "processed")]
        assert await keys("status=processing") == [("stripe:evt_3", "processing")]
        assert await keys("status=queued") == []
        assert [k for k, _ in await keys("type=invoice.paid&status=dead")] == ["stripe:evt_2"]
        since, until = (NOW - timedelta(minutes=45)).isoformat(), (NOW - timedelta(minutes=25)).isoformat()
        assert [k for k, _ in await keys(f"since={since}&until={until}".replace("+", "%2B"))] == [
            "stripe:evt_3",
            "stripe:evt_2",
        ]
        assert await keys("key=stripe:evt_2") == [("stripe:evt_2", "dead")]
        assert [k for k, _ in await keys("event_id=d/")] == ["github:d/1"]
        assert await keys('payload={"customer":"cus_123"}') == [  # the copy carries the same body
            ("stripe:evt_1", "duplicate"),
            ("stripe:evt_3", "processing"),
            ("stripe:evt_1", "processed"),
        ]
        cli = json.loads(
            (await asyncio.to_thread(events, "list", "--payload", '{"customer": "cus_123"}', "--json")).stdout
        )
        assert cli == (await get(client, '/admin/events?payload={"customer": "cus_123"}'))[1]


async def test_pages_follow_one_another_by_cursor(admin_settings, archived):
    async with running_ingress(admin_settings, load_sources(None)) as client:
        seen, query = [], "/admin/events?limit=4"
        status, first = await get(client, query)
        assert (status, first["count"], len(first["events"])) == (200, 6, 4) and first["next"]
        status, second = await get(client, f"{query}&cursor={first['next']}")
        assert second["count"] is None and second["next"] is None  # the count on the first page only
        seen = [(row["key"], row["received_at"]) for row in first["events"] + second["events"]]
        _, everything = await get(client, "/admin/events")
    assert seen == [(row["key"], row["received_at"]) for row in everything["events"]]


async def test_copies_received_in_one_millisecond_are_each_a_row_of_the_pages(admin_settings):
    """Three arrivals of one key sharing their millisecond: a page of one
    row at a time shows each once, and the event's page lists all three."""
    first = dataclasses.replace(event("stripe", "evt_7", 1, "invoice.paid"), arrival=new_arrival())
    copies = [first, *(dataclasses.replace(first, arrival=new_arrival()) for _ in range(2))]
    connection = await asyncpg.connect(admin_settings.database_url)
    try:
        store = ArchiveStore(connection)
        await store.keep({"stripe": timedelta(days=7)})
        await store.write_arrivals([archive.arrival_row(e, "invoice.paid", "{}", archive.QUEUED) for e in copies])
        await store.write_outcomes(
            [
                archive.outcome_row(copies[0], archive.PROCESSED, NOW.timestamp()),
                *(archive.outcome_row(e, archive.DUPLICATE, NOW.timestamp()) for e in copies[1:]),
            ]
        )
    finally:
        await connection.close()
    async with running_ingress(admin_settings, load_sources(None)) as client:
        statuses, cursor = [], ""
        for _ in range(4):
            status, page = await get(client, f"/admin/events?limit=1{cursor}")
            assert status == 200, page
            statuses += [row["status"] for row in page["events"]]
            if page["next"] is None:
                break
            cursor = f"&cursor={page['next']}"
        _, shown = await get(client, "/admin/events/stripe:evt_7")
    assert sorted(statuses) == ["duplicate", "duplicate", "processed"]
    assert sorted(a["status"] for a in shown["arrivals"]) == ["duplicate", "duplicate", "processed"]


async def test_an_events_page_holds_every_arrival_of_its_key_and_what_was_recorded(admin_settings, archived):
    async with running_ingress(admin_settings, load_sources(None)) as client:
        status, shown = await get(client, "/admin/events/stripe:evt_1", token=VIEWER)  # the viewer may read
        assert status == 200
        assert [a["status"] for a in shown["arrivals"]] == ["processed", "duplicate", "conflict"]
        assert shown["arrivals"][0]["payload"] == {"id": "evt_1", "type": "invoice.paid", "customer": "cus_123"}
        assert shown["arrivals"][0]["headers"] == {"x-test": "1"}
        assert shown["completion"]["attempts"] == 1 and shown["dead_letters"] == []
        _, dead = await get(client, "/admin/events/stripe:evt_2")
        assert [d["id"] for d in dead["dead_letters"]] == [archived["dead_letter"]]
        assert dead["arrivals"][0]["last_error"] == "RuntimeError: 500"
        assert (await get(client, "/admin/events/github:d/1"))[0] == 200  # an id with a slash
        assert (await get(client, "/admin/events/stripe:nope"))[0] == 404
        cli = json.loads((await asyncio.to_thread(events, "show", "stripe:evt_1", "--json")).stdout)
    assert cli == shown


@pytest.mark.parametrize(
    "query, code",
    [
        ("status=lost", "invalid_status"),
        ("since=yesterday", "invalid_since"),
        ("payload=[1]", "invalid_payload"),
        ("payload={", "invalid_payload"),
        ("limit=0", "invalid_limit"),
        ("limit=99999999", "invalid_limit"),
        ("cursor=xyz", "invalid_cursor"),
    ],
)
async def test_a_filter_that_cannot_be_one_is_a_400(admin_settings, query, code):
    async with running_ingress(admin_settings, load_sources(None)) as client:
        assert await get(client, f"/admin/events?{query}") == (400, {"error": code})
        response = await client.get("/admin/events")
        assert response.status == 401  # no token


def test_the_cli_says_in_one_line_what_is_wrong(admin_settings):
    result = events("list", "--since", "yesterday")
    assert result.exit_code == 2 and result.output.startswith("error: invalid --since: since: an ISO 8601 time")
    result = events("show", "stripe:nope")
    assert result.exit_code == 2 and "no archived event with key 'stripe:nope'" in result.output


async def test_a_cursor_nested_past_the_parsers_stack_is_a_400_and_the_consoles_newest_page(admin_settings):
    nested = base64.urlsafe_b64encode(b"[" * 1200).decode().rstrip("=")
    async with running_ingress(admin_settings, load_sources(None)) as client:
        assert await get(client, f"/admin/events?cursor={nested}") == (400, {"error": "invalid_cursor"})
        await console_login(client, TOKEN)
        page = await client.get(f"/console/events?cursor={nested}")
        assert page.status == 200 and "The page link is not valid" in await page.text()


@pytest.mark.parametrize(
    "query, code",
    [
        ("source=a%00b", "invalid_source"),
        ("key=%00", "invalid_key"),
        ('payload={"n": NaN}', "invalid_payload"),
        ('payload={"a": "\\u0000"}', "invalid_payload"),
    ],
)
async def test_a_filter_postgres_would_refuse_is_a_400_not_a_database_failure(admin_settings, query, code):
    async with running_ingress(admin_settings, load_sources(None)) as client:
        assert await get(client, f"/admin/events?{query}") == (400, {"error": code})


@pytest.mark.parametrize(
    "path, code",
    [
        ('/admin/events?payload={"a": 1e999999}', "invalid_payload"),
        ('/admin/events?payload={"a": 1e-999999}', "invalid_payload"),
        ("/admin/events/h:%00", "invalid_key"),
        ("/admin/dead-letters?source=%00", "invalid_source"),
    ],
)
async def test_search_input_postgres_cannot_take_is_a_400_not_an_outage(admin_settings, path, code):
    """Issue 36, finding 11: a number past numeric's range or a NUL in an
    event's key read as a database outage (503 and a warning line)."""
    async with running_ingress(admin_settings, load_sources(None)) as client:
        assert await get(client, path) == (400, {"error": code})
        assert (await client.get("/readyz")).status == 200  # and nothing counts it as an outage


async def test_a_payload_filter_the_index_cannot_serve_is_refused(admin_settings, archived):
    """Issue 36, finding 12: the payload index (jsonb_path_ops) keeps the
    paths to values; a filter naming no value ({"nokey": {}}) gives it
    nothing to look up, and Postgres read every body (0.74 s at 60,000
    rows, growing with the archive). Refused with words saying why; a
    filter with a value beside an empty object is served."""
    async with running_ingress(admin_settings, load_sources(None)) as client:
        for unservable in ('{"nokey": {}}', "{}", '{"a": []}', '{"a": [{}], "b": {"c": {}}}'):
            assert await get(client, f"/admin/events?payload={unservable}") == (400, {"error": "invalid_payload"})
        status, page = await get(client, '/admin/events?payload={"customer": "cus_123", "nokey": {}}')
        assert (status, page["events"]) == (200, [])
        status, page = await get(client, '/admin/events?payload={"customer": "cus_123"}')
        assert status == 200 and len(page["events"]) == 3
    result = await asyncio.to_thread(events, "list", "--payload", '{"nokey": {}}')
    assert result.exit_code == 2 and "at least one value" in result.output


# A payload search Postgres runs in parallel (issue 22, item 4): the
# payload function's exception block is a subtransaction, which a parallel
# operation may not start, so it must keep such a search in one process
# (migration 0015). Real Postgres, the plan forced parallel as a large
# archive would get it.


async def test_a_payload_search_planned_in_parallel_answers(settings):
    events = [make_event("stripe", f"evt_{n}", {"customer": f"cus_{n % 3}"}) for n in range(30)]
    connection = await asyncpg.connect(settings.database_url)
    try:
        store = ArchiveStore(connection)
        await store.keep({"stripe": timedelta(days=7)})
        await store.write_arrivals([archive.arrival_row(e, "t", json.dumps({}), archive.QUEUED) for e in events])
        await connection.execute("SET force_parallel_mode = on")  # PG 15's name (debug_parallel_query in 16)
        rows = await store.search(EventFilter(payload='{"customer": "cus_1"}'))
        assert len(rows) == 10
        assert await store.count(EventFilter(payload='{"customer": "cus_1"}')) == 10
    finally:
        await connection.close()


# The archive's searches through their indexes (migrations 0018, 0019 and
# 0024; issue 22, item 4: docs/performance.md, "Searching a million archived
# events") find what a read of every row finds. Beside the rows searched
# for, stripe has FILLER processed invoices, analyzed, so the searches are
# planned as over a large archive, through the filter's index (checked in
# the plan); each runs again with index scans off, reading every row, and
# must find the same. Prefixes at the edges of byte order (a character past
# ASCII, the last code point, a capital), which the "C" collation's range
# must hold whatever the database's own.

EVENT_ID, TYPE = "event_archive_event_id_prefix", "event_archive_type"
STATUS, UNSETTLED = "event_archive_status", "event_archive_unsettled"
IDS = ["evt_a", "evt_a1", "evt_a\u00e9", "evt_a\U0010ffff", "evt_b", "EVT_a", "evt_"]
FILLER = 3_000
ROUTES = SourceRoutes(("stripe", "stripe"), ("billing", "audit"))  # as searches pass the sources file's


@pytest.fixture
async def connection(settings):
    """stripe and github each with every id of IDS (stripe's invoice.paid,
    github's push); stripe's evt_a dead, evt_b retrying, github's evt_a a
    copy, evt_b queued with its lease held (processing), the rest processed;
    and stripe's FILLER invoice.created, processed."""
    events = {
        (source, event_id): make_event(source, event_id, {"n": n})
        for source in ("stripe", "github")
        for n, event_id in enumerate(IDS)
    }
    filler = [make_event("stripe", f"fill_{n}", {"n": n}) for n in range(FILLER)]
    connection = await asyncpg.connect(settings.database_url)
    store = ArchiveStore(connection)
    await store.keep({"stripe": timedelta(days=7), "github": timedelta(days=7)})
    await store.write_arrivals(
        [archive.arrival_row(event, "invoice.created", "{}", archive.QUEUED) for event in filler]
    )
    await store.write_outcomes([archive.outcome_row(event, archive.PROCESSED, 0.0) for event in filler])
    await store.write_arrivals(
        [
            archive.arrival_row(event, "invoice.paid" if source == "stripe" else "push", json.dumps({}), archive.QUEUED)
            for (source, _), event in events.items()
        ]
    )
    ends = {
        ("stripe", "evt_a"): archive.DEAD,
        ("stripe", "evt_b"): archive.RETRYING,
        ("github", "evt_a"): archive.DUPLICATE,
        ("github", "evt_b"): None,
    }
    await store.write_outcomes(
        [
            archive.outcome_row(event, ends.get(name, archive.PROCESSED), 0.0)
            for name, event in events.items()
            if ends.get(name, archive.PROCESSED)
        ]
    )
    await connection.execute(
        "INSERT INTO key_fences (key, token, lease_until) VALUES ($1, 1, now() + interval '1 hour')",
        events["github", "evt_b"].key,
    )
    await connection.execute("ANALYZE event_archive")
    yield connection
    await connection.close()


async def found(connection: asyncpg.Connection, where: EventFilter) -> tuple[list[str], int]:
    store = ArchiveStore(connection)
    return (
        [row["key"] for row in await store.search(where, limit=100, routes=ROUTES)],
        await store.count(where, COUNT_CAP, ROUTES),
    )


async def indexes_read(connection: asyncpg.Connection, where: EventFilter) -> set[str]:
    """The archive's indexes (the partitioned ones, not each day's) the count's plan reads."""
    async with connection.transaction(readonly=True):
        await connection.execute("SET LOCAL plan_cache_mode = force_custom_plan")
        plan = "\n".join(
            row[0]
            for row in await connection.fetch(
                f"EXPLAIN {SQL['count_archive']}", *where.arguments(), COUNT_CAP, *ROUTES.arguments()
            )
        )
    days = re.findall(r"Index (?:Only )?Scan (?:Backward )?(?:using|on) (\S+)", plan)
    rows = await connection.fetch(
        """
        WITH RECURSIVE up(index) AS (SELECT unnest($1::regclass[])::oid
                                     UNION SELECT inhparent FROM pg_inherits JOIN up ON inhrelid = up.index)
        SELECT index::regclass::text FROM up WHERE NOT EXISTS (SELECT FROM pg_inherits WHERE inhrelid = up.index)""",
        days,
    )
    return {row[0] for row in rows}


@pytest.mark.parametrize(
    ("where", "keys", "index"),
    [
        # A key is SOURCE:EVENT_ID: a key prefix naming its source is its source's event id prefix (0024)
        (
            EventFilter(key="stripe:evt_a"),
            ["stripe:evt_a", "stripe:evt_a1", "stripe:evt_a\u00e9", "stripe:evt_a\U0010ffff"],
            EVENT_ID,
        ),
        (EventFilter(key="stripe:evt_a\U0010ffff"), ["stripe:evt_a\U0010ffff"], EVENT_ID),
        (
            EventFilter(key="githu"),
            [f"github:{event_id}" for event_id in IDS],
            None,
        ),  # no ':', no source named: no pruning
        (EventFilter(key="stripe:EVT"), ["stripe:EVT_a"], EVENT_ID),
        (EventFilter(key="github:"), [f"github:{event_id}" for event_id in IDS], None),
        (EventFilter(key="stripe:evt_a", event_id="evt_a1"), ["stripe:evt_a1"], EVENT_ID),
        (
            EventFilter(event_id="evt_a"),
            [f"{source}:{event_id}" for source in ("github", "stripe") for event_id in IDS[:4]],
            EVENT_ID,
        ),
        (EventFilter(event_id="evt_a\u00e9"), ["github:evt_a\u00e9", "stripe:evt_a\u00e9"], EVENT_ID),
        (EventFilter(event_type="push"), [f"github:{event_id}" for event_id in IDS], TYPE),
        (EventFilter(status="dead"), ["stripe:evt_a"], STATUS),
        (EventFilter(status="retrying"), ["stripe:evt_b"], UNSETTLED),
        (EventFilter(status="duplicate"), ["github:evt_a"], STATUS),
        (EventFilter(status="processing"), ["github:evt_b"], UNSETTLED),
        (EventFilter(status="queued"), [], UNSETTLED),
    ],
)
async def test_an_indexed_search_finds_what_reading_every_row_finds(connection, where, keys, index):
    if index is not None:
        assert index in await indexes_read(connection, where)
    indexed, indexed_count = await found(connection, where)
    await connection.execute("SET enable_indexscan = off; SET enable_bitmapscan = off; SET enable_indexonlyscan = off")
    scanned, scanned_count = await found(connection, where)
    assert sorted(indexed) == sorted(scanned) == sorted(keys)
    assert indexed_count == scanned_count == len(keys)


async def test_no_index_is_kept_on_the_key_alone(connection):
    """Every arrival entered it, and every outcome's update again (0024):
    the event id's index serves a key's prefix within its source."""
    names = {
        row[0] for row in await connection.fetch("SELECT indexname FROM pg_indexes WHERE tablename = 'event_archive'")
    }
    assert "event_archive_key_prefix" not in names
    assert EVENT_ID in names
