"""The event archive in real Postgres (shared/archive/store.py, writer.py,
shared/upkeep.py): each source's days made and dropped whole, what each
side writes, rows refused or waiting for Postgres."""

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from tests.support.events import make_event
from tests.support.processes import wait_until
from tests.support.tcpproxy import TcpProxy
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.archive.store import ArchiveStore
from webhook_ingest.shared.archive.writer import BatchedWriter
from webhook_ingest.shared.observability import metrics
from webhook_ingest.shared.sources.model import parse_source
from webhook_ingest.shared.upkeep import ArchiveUpkeep

NOW = datetime.now(UTC)
DAY = timedelta(days=1)


@pytest.fixture
async def connection(database):
    connection = await asyncpg.connect(database)
    yield connection
    await connection.close()


def arrival(source: str, event_id: str, at: datetime, status: str = archive.QUEUED):
    event = dataclasses.replace(make_event(source, event_id), received_at=at.timestamp())
    return event, archive.arrival_row(event, "test.event", '{"content-type": "application/json"}', status)


async def days_of(connection, source: str) -> list[str]:
    return sorted(
        await connection.fetchval(
            "SELECT coalesce(array_agg(relname::text), '{}') FROM pg_inherits JOIN pg_class ON oid = inhrelid"
            " WHERE inhparent = to_regclass($1)",
            archive.source_table(source),
        )
    )


async def archived(connection, source: str) -> list[asyncpg.Record]:
    return await connection.fetch("SELECT * FROM event_archive WHERE source = $1 ORDER BY received_at", source)


# -- days ------------------------------------------------------------------------------


async def test_each_source_gets_its_own_days_from_yesterday_to_three_days_ahead(connection):
    made, dropped = await ArchiveStore(connection).keep(
        {"acme": timedelta(days=7), "zed": timedelta(days=30), "off": timedelta(0)}, now=NOW
    )
    today = NOW.date()
    expected = [archive.day_table("acme", today + n * DAY) for n in range(-1, 4)]
    assert await days_of(connection, "acme") == expected and (made, dropped) == (10, 0)
    assert len(await days_of(connection, "zed")) == 5
    assert await connection.fetchval("SELECT to_regclass($1)", archive.source_table("off")) is None  # not archived
    assert await ArchiveStore(connection).keep({"acme": timedelta(days=7)}, now=NOW) == (0, 0)  # idempotent


async def test_retention_drops_a_sources_days_whole_and_leaves_the_rest(connection):
    store = ArchiveStore(connection)
    retentions = {"acme": timedelta(days=7), "zed": timedelta(days=30)}
    await store.keep(retentions, now=NOW)
    rows = [arrival(source, f"evt_{n}", NOW + n * DAY)[1] for source in retentions for n in (-1, 0, 3)]
    await store.write_arrivals(rows)

    _made, dropped = await store.keep(retentions, now=NOW + 9 * DAY)  # acme keeps from NOW + 2 days on

    assert dropped == 3  # acme's yesterday, today and tomorrow
    assert [row["event_id"] for row in await archived(connection, "acme")] == ["evt_3"]
    assert [row["event_id"] for row in await archived(connection, "zed")] == ["evt_-1", "evt_0", "evt_3"]
    kept = [2, 3, *range(8, 13)]  # the days between were never made: nothing arrived on them
    assert await days_of(connection, "acme") == [archive.day_table("acme", NOW.date() + n * DAY) for n in kept]
    deleted = await connection.fetchval(
        "SELECT coalesce(sum(n_tup_del), 0) FROM pg_stat_user_tables WHERE relname LIKE 'event_archive%'"
    )
    assert deleted == 0  # whole tables dropped, never a DELETE


async def test_a_source_set_to_zero_loses_its_days(connection):
    store = ArchiveStore(connection)
    await store.keep({"acme": timedelta(days=7)}, now=NOW)
    await store.keep({"acme": timedelta(0)}, now=NOW)
    assert await days_of(connection, "acme") == []


# -- rows ------------------------------------------------------------------------------


async def test_an_arrival_keeps_what_was_received(connection):
    store = ArchiveStore(connection)
    await store.keep({"acme": timedelta(days=7)}, now=NOW)
    event, row = arrival("acme", "evt_1", NOW)
    await store.write_arrivals([row, row])  # twice in one batch: one row
    [stored] = await archived(connection, "acme")
    assert bytes(stored["body"]) == event.body and stored["status"] == "queued" and stored["attempts"] == 0
    assert stored["event_type"] == "test.event" and stored["key"] == "acme:evt_1"
    assert stored["received_at"] == datetime.fromtimestamp(round(event.received_at * 1000) / 1000, UTC)


async def test_what_became_of_an_arrival_only_moves_forward(connection):
    store = ArchiveStore(connection)
    await store.keep({"acme": timedelta(days=7)}, now=NOW)
    event, row = arrival("acme", "evt_1", NOW)
    second = dataclasses.replace(event, attempt=2)
    replayed = dataclasses.replace(event, attempt=1, replay_of=5)
    at = NOW.timestamp()

    async def outcome(*rows) -> tuple:
        await store.write_outcomes(list(rows))
        [stored] = await archived(connection, "acme")
        return stored["status"], stored["attempts"], stored["replay_of"], stored["last_error"]

    assert await outcome(archive.outcome_row(event, archive.RETRYING, at, "RuntimeError: 500")) == (
        "retrying",
        1,
        0,
        "RuntimeError: 500",
    )  # before the ingress's row: made without a body
    await store.write_arrivals([row])
    [stored] = await archived(connection, "acme")
    assert bytes(stored["body"]) == event.body and stored["status"] == "retrying"  # the ingress fills it in
    assert (await outcome(archive.outcome_row(event, archive.DUPLICATE, at)))[0] == "retrying"  # a retry's copy
    assert (await outcome(archive.outcome_row(second, archive.DEAD, at, "RuntimeError: 503")))[:2] == ("dead", 2)
    assert (await outcome(archive.outcome_row(event, archive.RETRYING, at, "late")))[0] == "dead"  # late, not over
    assert await outcome(archive.outcome_row(replayed, archive.PROCESSED, at)) == (
        "processed",
        1,
        5,
        "RuntimeError: 503",
    )
    [stored] = await archived(connection, "acme")
    assert stored["completed_at"] is not None


async def test_a_copy_is_a_duplicate_only_while_it_never_ran(connection):
    store = ArchiveStore(connection)
    await store.keep({"acme": timedelta(days=7)}, now=NOW)
    event, row = arrival("acme", "evt_1", NOW)
    await store.write_arrivals([row])
    at = NOW.timestamp()
    await store.write_outcomes(
        [archive.outcome_row(event, archive.PROCESSED, at), archive.outcome_row(event, archive.DUPLICATE, at)]
    )  # one batch, two rounds
    assert [r["status"] for r in await archived(connection, "acme")] == ["processed"]


async def test_the_size_of_each_sources_archive(connection):
    store = ArchiveStore(connection)
    await store.keep({"acme": timedelta(days=7)}, now=NOW)
    empty = await store.sizes(["acme", "nowhere"])
    await store.write_arrivals([arrival("acme", f"evt_{n}", NOW)[1] for n in range(200)])
    sizes = await store.sizes(["acme", "nowhere"])
    assert sizes["nowhere"] == 0 and sizes["acme"] > empty["acme"]


# -- the writer ------------------------------------------------------------------------


async def test_a_row_postgres_refuses_is_dropped_alone(connection):
    store = ArchiveStore(connection)
    await store.keep({"acme": timedelta(days=7)}, now=NOW)
    writer = BatchedWriter(store.write_arrivals, "arrivals", max_rows=100)
    writer.ready.set()
    refused_before = metrics.archive_rows_dropped.labels("refused")._value.get()
    for row in (
        arrival("acme", "evt_1", NOW)[1],
        arrival("nowhere", "evt_2", NOW)[1],  # no table for that source
        arrival("acme", "evt_3", NOW - 30 * DAY)[1],
        arrival("acme", "evt_4", NOW)[1],
    ):  # nor that day
        writer.add(row)
    task = asyncio.create_task(writer.run())
    try:
        await writer.flush(timeout=10)
    finally:
        task.cancel()
    assert [row["event_id"] for row in await archived(connection, "acme")] == ["evt_1", "evt_4"]
    assert metrics.archive_rows_dropped.labels("refused")._value.get() - refused_before == 2


async def test_rows_wait_while_postgres_is_away_and_are_written_once_it_is_back(database, connection):
    await ArchiveStore(connection).keep({"acme": timedelta(days=7)}, now=NOW)
    with TcpProxy("127.0.0.1", 5432) as proxy:
        pool = await asyncpg.create_pool(proxy.url_for(database), min_size=0, max_size=2)
        writer = BatchedWriter(ArchiveStore(pool).write_arrivals, "arrivals", max_rows=100)
        writer.ready.set()
        task = asyncio.create_task(writer.run())
        try:
            proxy.cut()
            for n in range(20):
                writer.add(arrival("acme", f"evt_{n}", NOW)[1])
            await asyncio.sleep(1.5)  # a few tries, each refused at the door
            assert await archived(connection, "acme") == [] and writer.waiting == 20
            proxy.restore()

            async def written() -> bool:
                return len(await archived(connection, "acme")) == 20

            await wait_until(written, 30, message="the 20 rows written after Postgres came back")
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await pool.close()


async def test_a_full_buffer_drops_new_rows_and_counts_them(connection):
    writer = BatchedWriter(ArchiveStore(connection).write_arrivals, "arrivals", max_rows=3)
    before = metrics.archive_rows_dropped.labels("buffer_full")._value.get()
    for n in range(5):
        writer.add(arrival("acme", f"evt_{n}", NOW)[1])
    assert writer.waiting == 3
    assert metrics.archive_rows_dropped.labels("buffer_full")._value.get() - before == 2


# -- the upkeep ------------------------------------------------------------------------


async def test_the_upkeep_opens_the_writer_once_the_days_exist_and_keeps_the_gauge(connection):
    sources = {"acme": parse_source("acme", {"scheme": "github", "secrets": ["s"], "handler": "inbox"})}
    upkeep = ArchiveUpkeep(ArchiveStore(connection), sources)
    assert not upkeep.ready.is_set()
    assert await upkeep.keep()
    assert upkeep.ready.is_set() and len(await days_of(connection, "acme")) == 5
    await upkeep.refresh_sizes()
    assert metrics.archive_bytes.labels("acme")._value.get() > 0  # the empty tables' indexes
