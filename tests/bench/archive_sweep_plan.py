"""How the archive's settling sweep reads a page (docs/performance.md, "The
archive's settling sweep"): `archive_unsettled`'s plan, EXPLAIN ANALYZEd as
ArchiveStore.settle runs it, on a scratch archive with a burst of unsettled
rows stamped with one millisecond. `python -m tests.bench.archive_sweep_plan`;
not part of `make bench`.

One throwaway database, migrated: SOURCES sources' days over the last DAYS
days, SETTLED `processed` rows spread over them, BURST `queued` rows of one
millisecond 30 minutes ago (a backlog still on its way) and 2,000
`retrying` rows newer than it. Then the page from the oldest and from a
cursor in the burst's middle, with a custom and a generic plan each: how
the page's rows are read (a Merge Append of each day's partial index is a
page; a Sort or an Incremental Sort reads more), the rows the sequential
scans of a day read (none but of empty days), the times; then one whole
`settle`. Dropped at the end.
"""

import asyncio
import os
import re
import time
from datetime import UTC, datetime, timedelta

import asyncpg

from tests.bench.deployment import scratch_database
from webhook_ingest.shared.archive.store import SQL, ArchiveStore

SOURCES = ["s1", "s2", "s3", "s4"]
DAYS = 11
SETTLED = int(os.environ.get("BENCH_SWEEP_SETTLED", "400000"))
BURST = int(os.environ.get("BENCH_SWEEP_BURST", "200000"))
PAGE = 500
GRACE = 60.0

FILL = [
    # settled rows, one every 2.2 s back from now over the sources in turn
    """INSERT INTO event_archive (source, key, received_at, arrival, event_id, payload_sha256, status, attempts)
       SELECT s, s || ':evt_' || n, now() - n * interval '2.2 seconds', n, 'evt_' || n, 'x', 'processed', 1
       FROM generate_series(1, $1) n, unnest($2::text[]) WITH ORDINALITY AS sources(s, i) WHERE n % 4 = i - 1""",
    # the burst: one millisecond, 30 minutes ago
    """INSERT INTO event_archive (source, key, received_at, arrival, event_id, payload_sha256, status, attempts)
       SELECT ($2::text[])[1 + n % 4], ($2::text[])[1 + n % 4] || ':burst_' || n,
              date_trunc('milliseconds', now()) - interval '30 minutes', n, 'burst_' || n, 'x', 'queued', 0
       FROM generate_series(1, $1) n""",
    # between attempts, newer than the burst
    """INSERT INTO event_archive (source, key, received_at, arrival, event_id, payload_sha256, status, attempts)
       SELECT ($2::text[])[1 + n % 4], ($2::text[])[1 + n % 4] || ':r_' || n, now() - n * interval '0.5 seconds', n,
              'r_' || n, 'x', 'retrying', 1
       FROM generate_series(1, $1) n""",
]


async def fill(connection: asyncpg.Connection) -> None:
    store = ArchiveStore(connection)
    for days_ago in range(DAYS, -1, -1):  # the upkeep makes days from yesterday on: the older ones as it did then
        await store.keep(
            {source: timedelta(days=30) for source in SOURCES}, now=datetime.now(UTC) - timedelta(days=days_ago)
        )
    for statement, rows in zip(FILL, (SETTLED, BURST, 2000)):
        await connection.execute(statement, rows, SOURCES)
    await connection.execute("ANALYZE event_archive")


async def explain(connection: asyncpg.Connection, mode: str, cursor: tuple) -> str:
    """The page's plan as the store plans it (incremental sorts off)."""
    async with connection.transaction(readonly=True):
        await connection.execute(f"SET LOCAL plan_cache_mode = {mode}")
        await connection.execute("SET LOCAL enable_incremental_sort = off")
        rows = await connection.fetch(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + SQL["archive_unsettled"],
            GRACE,
            cursor[0],
            PAGE,
            [],
            [],
            *cursor[1:],
        )
    return "\n".join(row[0] for row in rows)


def summary(plan: str) -> str:
    lines = plan.splitlines()
    limit = next(i for i, line in enumerate(lines) if "->  Limit" in line)
    reading = next(line for line in lines[limit + 1 :] if "->" in line).strip().removeprefix("->  ")
    seq_rows = sum(int(m) for line in lines if "Seq Scan" in line for m in re.findall(r"rows=(\d+) loops", line))
    times = [line.split(": ")[1] for line in lines if line.startswith(("Planning Time", "Execution Time"))]
    return (
        f"page read by: {reading}\n    rows the days' sequential scans read: {seq_rows}; planning, execution: {times}"
    )


async def main() -> None:
    async with scratch_database("wi_bench_sweep") as connection:
        started = time.perf_counter()
        await fill(connection)
        tables = await connection.fetchval("SELECT count(*) FROM pg_partition_tree('event_archive') WHERE isleaf")
        print(
            f"{SETTLED} settled, {BURST} of one millisecond, 2000 retrying; {tables} day tables; "
            f"filled in {time.perf_counter() - started:.0f} s"
        )
        middle = await connection.fetchrow(
            "SELECT received_at, source, key, arrival FROM event_archive WHERE status = 'queued'"
            " ORDER BY received_at, source, key, arrival OFFSET $1 LIMIT 1",
            BURST // 2,
        )
        for mode in ("force_custom_plan", "force_generic_plan"):
            for name, cursor in (("from the oldest", (None,) * 4), ("from the burst's middle", tuple(middle.values()))):
                print(f"{mode}, {name}:\n    {summary(await explain(connection, mode, cursor))}")
        started = time.perf_counter()
        settled, after = await ArchiveStore(connection).settle(GRACE, {})
        print(
            f"one settle: {settled} rows settled, a page after it: {after is not None}, "
            f"{(time.perf_counter() - started) * 1000:.1f} ms"
        )


if __name__ == "__main__":
    asyncio.run(main())
