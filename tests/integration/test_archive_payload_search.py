"""A payload search Postgres runs in parallel (issue 22, item 4): the
payload function's exception block is a subtransaction, which a parallel
operation may not start, so it must keep such a search in one process
(migration 0015). Real Postgres, the plan forced parallel as a large
archive would get it."""

import json
from datetime import timedelta

import asyncpg

from tests.support.events import make_event
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.archive.search import EventFilter
from webhook_ingest.shared.archive.store import ArchiveStore


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
