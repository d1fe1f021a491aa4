"""The archive's floor (issue 22, item 3): what Postgres itself spends to
keep one event, the pipeline's statements and batching aside, next to the
budget item 3 gives it. `python -m tests.bench --phase archive_floor`
alone; in `make bench` after the archive phase, whose runs without the
archive give the budget: 15 % of Postgres's CPU per event then.

One throwaway database, migrated (this release's schema and indexes, read
back from it), one source's day table. Each step is one statement over
ROWS rows of the bench's shape (a 1 KiB JSON body, the headers an ingress
keeps), so a statement's own cost (planning, a batch's round trip, the
unnest of its arrays) is spread thin: what is left is the row, its
indexes and its WAL. The backend's CPU is read from /proc around each
statement (Postgres's shared processes, the WAL writer and the
checkpointer, are not counted: a floor, not an estimate):

- the arrival with its primary key only (no search at all);
- with the btree indexes item 4's search uses, then with its payload
  index too (the JSON body parsed, its paths hashed);
- as this release writes it (the settling sweep's and the rare statuses'
  partial indexes too), then its outcome: the row's status set to
  processed, an update that is never HOT (`status` is in those indexes'
  predicates), which enters every index again and leaves a dead version
  for the VACUUM that follows;
- the same outcome as a HOT update: without those two indexes, the day's
  table at fillfactor 60, so the new version fits beside the old one.
"""

import asyncio
import os
import time
from datetime import UTC, datetime, timedelta

import asyncpg

from tests.bench.cpu import cpu_seconds
from tests.bench.deployment import scratch_database

ROWS = int(os.environ.get("BENCH_FLOOR_ROWS", "50000"))
SOURCE, SOURCE_TABLE = "kept", "event_archive_kept"
BUDGET_SHARE = 0.15  # item 3: Postgres's CPU per event may grow by at most 15 %
SEARCH_BTREES = ("event_archive_received_at", "event_archive_type", "event_archive_event_id_prefix")
PAYLOAD_INDEX = "event_archive_payload_gin"
STATUS_INDEXES = ("event_archive_unsettled", "event_archive_status")  # their predicates name `status`

# The rows, made once (their making is not the archive's cost): the headers as the
# ingress sends them, text for Postgres to parse.
ARRIVING = """
CREATE TEMPORARY TABLE arriving AS
SELECT $1::text || ':evt_' || n AS key, $2::timestamptz + n * interval '1 millisecond' AS received_at,
       n::int8 AS arrival, 'evt_' || n AS event_id, md5(n::text) AS payload_sha256,
       convert_to(json_build_object('id', 'evt_' || n, 'type', 'bench.event', 'pad', repeat('x', 980))::text,
                  'UTF8') AS body,
       json_build_object('Host', '127.0.0.1', 'Content-Type', 'application/json', 'Content-Length', '1024',
                         'X-Signature', 'sha256=' || encode(sha256(n::text::bytea), 'hex'))::text AS headers
FROM generate_series(1, $3) AS n
"""
ARRIVE = """
INSERT INTO event_archive (source, key, received_at, arrival, event_id, event_type, payload_sha256, body, headers,
                           status)
SELECT $1, key, received_at, arrival, event_id, 'bench.event', payload_sha256, body, headers::jsonb, 'queued'
FROM arriving
"""
OUTCOME = """
UPDATE event_archive SET status = 'processed', attempts = 1, completed_at = received_at + interval '150 ms'
WHERE source = $1
"""

ROW_LABELS = [  # the floor's, µs per event unless said
    ("floor_arrival_bare_us", "floor: arrival, its primary key only"),
    ("floor_arrival_btrees_us", "floor: arrival, + the search's btree indexes"),
    ("floor_arrival_search_us", "floor: arrival, + the payload index (item 4)"),
    ("floor_arrival_release_us", "floor: arrival, this release's indexes"),
    ("floor_outcome_release_us", "floor: outcome, this release (never HOT)"),
    ("floor_vacuum_release_us", "floor: its VACUUM"),
    ("floor_release_total_us", "floor: this release, arrival + outcome + VACUUM"),
    ("floor_arrival_hot_us", "floor: arrival, no status indexes, fillfactor 60"),
    ("floor_outcome_hot_us", "floor: outcome as a HOT update"),
    ("floor_vacuum_hot_us", "floor: its VACUUM"),
    ("floor_hot_total_us", "floor: HOT, arrival + outcome + VACUUM"),
    ("floor_least_total_us", "floor: least, bare arrival + HOT outcome"),
    ("floor_release_wal_bytes", "floor: this release, WAL bytes per event"),
    ("floor_budget_us", "item 3's budget: 15 % of Postgres's µs, archive off"),
]
ROWS_TABLE = [(key, label, "{:,.1f}") for key, label in ROW_LABELS]


class Backend:
    """One connection, and the CPU its server process spends per row of a statement."""

    def __init__(self, connection: asyncpg.Connection, pid: int):
        self.connection, self._pid = connection, pid

    async def per_row(self, statement: str, *args: object) -> float:
        before = cpu_seconds(self._pid)
        await self.connection.execute(statement, *args, timeout=600)
        return (cpu_seconds(self._pid) - before) / ROWS * 1e6

    async def wal_per_row(self, statement: str, *args: object) -> tuple[float, float]:
        start = await self.connection.fetchval("SELECT pg_current_wal_insert_lsn()")
        micros = await self.per_row(statement, *args)
        wal = await self.connection.fetchval("SELECT pg_current_wal_insert_lsn() - $1::pg_lsn", start)
        return micros, float(wal) / ROWS


async def measure(figures: dict) -> None:
    async with scratch_database("wi_bench_floor") as connection:
        backend = Backend(connection, await connection.fetchval("SELECT pg_backend_pid()"))
        day = await _source_day(connection)
        received = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(minutes=1)
        await connection.execute(ARRIVING, SOURCE, received, ROWS)
        definitions = await _drop_indexes(connection, (*SEARCH_BTREES, PAYLOAD_INDEX, *STATUS_INDEXES))
        figures["floor_arrival_bare_us"] = await _arrive(backend, day)
        await _create(connection, definitions, SEARCH_BTREES)
        figures["floor_arrival_btrees_us"] = await _arrive(backend, day)
        await _create(connection, definitions, (PAYLOAD_INDEX,))
        figures["floor_arrival_search_us"] = await _arrive(backend, day)
        await _create(connection, definitions, STATUS_INDEXES)
        figures["floor_arrival_release_us"], arrival_wal = await _arrive(backend, day, wal=True)
        figures["floor_outcome_release_us"], outcome_wal = await backend.wal_per_row(OUTCOME, SOURCE)
        figures["floor_vacuum_release_us"] = await backend.per_row(f"VACUUM {day}")
        figures["floor_release_wal_bytes"] = arrival_wal + outcome_wal
        await _drop_indexes(connection, STATUS_INDEXES)
        await connection.execute(f"ALTER TABLE {day} SET (fillfactor = 60)")
        figures["floor_arrival_hot_us"] = await _arrive(backend, day)
        figures["floor_outcome_hot_us"] = await backend.per_row(OUTCOME, SOURCE)
        figures["floor_vacuum_hot_us"] = await backend.per_row(f"VACUUM {day}")
    for name in ("release", "hot"):
        figures[f"floor_{name}_total_us"] = sum(
            figures[f"floor_{step}_{name}_us"] for step in ("arrival", "outcome", "vacuum")
        )
    figures["floor_least_total_us"] = figures["floor_arrival_bare_us"] + figures["floor_outcome_hot_us"]
    if "archive_plain_cpu_ms_postgres" in figures:  # the archive phase ran: its runs without the archive
        figures["floor_budget_us"] = BUDGET_SHARE * figures["archive_plain_cpu_ms_postgres"] * 1000


async def _source_day(connection: asyncpg.Connection) -> str:
    today = datetime.now(UTC).date()
    await connection.execute("SELECT event_archive_keep($1, $2, $3, $3, $3)", SOURCE, SOURCE_TABLE, today)
    return f"{SOURCE_TABLE}_{today:%Y%m%d}"


async def _arrive(backend: Backend, day: str, wal: bool = False):
    """ROWS arrivals into an empty day; µs per row (and WAL bytes per row)."""
    await backend.connection.execute(f"TRUNCATE {day}")
    await backend.connection.execute("CHECKPOINT")  # each step starts alike: its pages' first images
    result = await backend.wal_per_row(ARRIVE, SOURCE)
    return result if wal else result[0]


async def _drop_indexes(connection: asyncpg.Connection, names: tuple[str, ...]) -> dict[str, str]:
    """Drops the archive's indexes `names` (each day's with them); their definitions, to make them again."""
    rows = await connection.fetch("SELECT indexname, indexdef FROM pg_indexes WHERE indexname = ANY($1)", list(names))
    for row in rows:
        await connection.execute(f"DROP INDEX {row['indexname']}")
    return {row["indexname"]: row["indexdef"] for row in rows}


async def _create(connection: asyncpg.Connection, definitions: dict[str, str], names: tuple[str, ...]) -> None:
    for name in names:  # read back as made on the parent alone ("ON ONLY"): made on each day's table too
        await connection.execute(definitions[name].replace(" ON ONLY ", " ON ", 1))


def print_figures(figures: dict) -> None:
    print(f"\n| {'µs per event, ' + format(ROWS, ',') + ' rows a statement':<52} | {'figure':>10} |")
    print(f"| {'-' * 52} | {'-' * 10} |")
    for key, label, fmt in ROWS_TABLE:
        if key in figures:
            print(f"| {label:<52} | {fmt.format(figures[key]):>10} |")


async def main() -> int:
    started = time.perf_counter()
    figures: dict[str, float] = {}
    await measure(figures)
    print_figures(figures)
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    asyncio.run(main())
