"""How the archive's upkeep reads the arrivals completions name
(`archive_settle_named`, docs/design.md, "The settling sweep"): its plan,
EXPLAIN ANALYZEd as ArchiveStore.settle_named runs it, on a scratch
database. `python -m tests.bench.archive_named_plan`; not part of `make bench`.

One throwaway database, migrated: SOURCES sources' days over the last DAYS
days, ARCHIVED `processed` rows spread over them, COMPLETIONS completions
naming the newest of them (one every 2.2 s back from now, as the rows),
1 in 100 of their arrivals archived `duplicate` (the rows to settle). Then
the statement with the upkeep's window (the last LOOKBACK seconds before
the grace) and with a full page of PAGE from a cursor in the middle, each
with a custom and a generic plan (rolled back): how processed_events is
read, how the archive is probed, the rows sequential scans read, the
times. Dropped at the end.
"""

import asyncio
import os
import re
from datetime import UTC, datetime, timedelta

import asyncpg

from tests.bench.deployment import scratch_database
from webhook_ingest.shared.archive.store import SETTLE_NAMED_PAGE, SQL, ArchiveStore
from webhook_ingest.shared.upkeep import SETTLE_NAMED_LOOKBACK_SECONDS

SOURCES = ["s1", "s2", "s3", "s4"]
DAYS = 11
ARCHIVED = int(os.environ.get("BENCH_NAMED_ARCHIVED", "400000"))
COMPLETIONS = int(os.environ.get("BENCH_NAMED_COMPLETIONS", "100000"))
GRACE = 60.0

FILL = [
    """INSERT INTO event_archive (source, key, received_at, arrival, event_id, payload_sha256, status, attempts)
       SELECT s, s || ':evt_' || n, now() - n * interval '2.2 seconds', n, 'evt_' || n, 'x',
              CASE WHEN n % 100 = 0 THEN 'duplicate' ELSE 'processed' END, 1
       FROM generate_series(1, $1) n, unnest($2::text[]) WITH ORDINALITY AS sources(s, i) WHERE n % 4 = i - 1""",
    """INSERT INTO processed_events (key, source, event_id, payload_sha256, attempts, completed_at, arrival)
       SELECT s, split_part(s, ':', 1), split_part(s, ':', 2), 'x', 1, now() - n * interval '2.2 seconds'
                                                                    + interval '1 second', n
       FROM generate_series(1, $1) n, unnest($2::text[]) WITH ORDINALITY AS sources(src, i),
            LATERAL (SELECT src || ':evt_' || n) AS k(s) WHERE n % 4 = i - 1""",
]


async def fill(connection: asyncpg.Connection) -> None:
    store = ArchiveStore(connection)
    for days_ago in range(DAYS, -1, -1):
        await store.keep(
            {source: timedelta(days=30) for source in SOURCES}, now=datetime.now(UTC) - timedelta(days=days_ago)
        )
    for statement, rows in zip(FILL, (ARCHIVED, COMPLETIONS)):
        await connection.execute(statement, rows, SOURCES)
    await connection.execute("ANALYZE event_archive; ANALYZE processed_events")


async def explain(connection: asyncpg.Connection, mode: str, after: tuple, lookback: float) -> str:
    """The statement's plan, rolled back."""
    transaction = connection.transaction()
    await transaction.start()
    try:
        await connection.execute(f"SET LOCAL plan_cache_mode = {mode}")
        rows = await connection.fetch(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + SQL["archive_settle_named"],
            *after,
            GRACE,
            SETTLE_NAMED_PAGE,
            lookback,
        )
    finally:
        await transaction.rollback()
    return "\n".join(row[0] for row in rows)


def summary(plan: str) -> str:
    lines = plan.splitlines()
    completions = next(line.strip().removeprefix("->  ") for line in lines if "processed_events" in line)
    probes = sorted(
        {m for line in lines for m in re.findall(r"Index (?:Only )?Scan using (event_archive\S*?)_pkey", line)}
    )
    seq_rows = sum(int(m) for line in lines if "Seq Scan" in line for m in re.findall(r"rows=(\d+) loops", line))
    times = [line.split(": ")[1] for line in lines if line.startswith(("Planning Time", "Execution Time"))]
    return (
        f"completions read by: {completions}\n"
        f"    archive day tables probed by primary key: {len(probes)}; rows sequential scans read: {seq_rows};"
        f" planning, execution: {times}"
    )


async def main() -> None:
    async with scratch_database("wi_bench_named") as connection:
        await fill(connection)
        tables = await connection.fetchval("SELECT count(*) FROM pg_partition_tree('event_archive') WHERE isleaf")
        print(f"{ARCHIVED} archived, {COMPLETIONS} completions; {tables} day tables")
        middle = await connection.fetchrow(
            "SELECT completed_at, key FROM processed_events ORDER BY completed_at, key OFFSET $1 LIMIT 1",
            COMPLETIONS // 2,
        )
        for mode in ("force_custom_plan", "force_generic_plan"):
            for name, after, lookback in (
                (
                    f"the upkeep's window ({SETTLE_NAMED_LOOKBACK_SECONDS:.0f} s)",
                    (None, None),
                    SETTLE_NAMED_LOOKBACK_SECONDS,
                ),
                (f"a full page of {SETTLE_NAMED_PAGE} from the middle", tuple(middle.values()), 86400.0 * DAYS),
            ):
                print(f"{mode}, {name}:\n    {summary(await explain(connection, mode, after, lookback))}")
        if os.environ.get("BENCH_NAMED_PLAN"):
            print(await explain(connection, "force_generic_plan", tuple(middle.values()), 86400.0 * DAYS))


if __name__ == "__main__":
    asyncio.run(main())
