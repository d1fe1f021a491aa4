"""The archive's searches through their indexes (migrations 0018, 0019 and
0024; issue 22, item 4: docs/performance.md, "Searching a million archived
events") find what a read of every row finds. Beside the rows searched
for, stripe has FILLER processed invoices, analyzed, so the searches are
planned as over a large archive, through the filter's index (checked in
the plan); each runs again with index scans off, reading every row, and
must find the same. Prefixes at the edges of byte order (a character past
ASCII, the last code point, a capital), which the "C" collation's range
must hold whatever the database's own."""

import json
import re
from datetime import timedelta

import asyncpg
import pytest

from tests.support.events import make_event
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.archive.search import COUNT_CAP, EventFilter, SourceRoutes
from webhook_ingest.shared.archive.store import SQL, ArchiveStore

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
