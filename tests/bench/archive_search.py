"""Searching 1,000,000 archived events (issue 22, item 4: under 500 ms on
this machine). `python -m tests.bench --phase archive_search`; not part of
`make test` or the other phases.

One throwaway database, migrated, its archive filled in SQL (one
INSERT … SELECT over generate_series, a few seconds a 100,000 rows): five
sources, one table a day for the last 7 days, rows spread evenly over them,
each source's own event types, JSON bodies of ~400 bytes with a customer
among CUSTOMERS, mostly `processed`, some dead, copies, retrying, 1 %
queued. Two sources have routes (ROUTES): a lease row (key_fences) for
each archived key's runs, KEY#ROUTE for theirs, KEY for the others', half
the queued events' leases held (one route's), so `processing` and `queued`
read the leases as over a real backlog. Then the statements the admin API
runs (ArchiveStore.search and .count: the named queries of
shared/archive/queries.sql, as prepared statements, as the API runs them, given
the sources file's routes; the status searches also without), each RUNS
times: median and max, against the goal, and EXPLAIN's
plan for any that misses it. The database is dropped at the end, whatever
happened.
"""

import asyncio
import json
import os
import statistics
import time
from datetime import UTC, datetime, timedelta

import asyncpg

from tests.bench.deployment import scratch_database
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.archive.search import COUNT_CAP, DEFAULT_LIMIT, NO_ROUTES, Cursor, EventFilter, SourceRoutes
from webhook_ingest.shared.archive.store import SQL, STATEMENT_SECONDS, ArchiveStore

ROWS = int(os.environ.get("BENCH_SEARCH_ROWS", "1000000"))  # fewer: a quick try of the bench itself
BATCH = 100_000
DAYS, CUSTOMERS = 7, 5_000
RUNS, MIN_RUNS, BUDGET_MS = 7, 3, 20_000  # a query far past the goal: 3 runs, not 7
GOAL_MS = 500.0
SOURCES = {  # source -> its event types
    "stripe": ["invoice.paid", "invoice.created", "charge.succeeded", "customer.updated", "payment_intent.failed"],
    "github": ["push", "pull_request", "issues", "check_run"],
    "shopify": ["orders/create", "orders/paid", "products/update"],
    "slack": ["message", "app_mention"],
    "acme": ["order.shipped", "order.cancelled", "refund.issued"],
}
ROUTES = SourceRoutes(
    ("stripe", "stripe", "stripe", "shopify", "shopify"), ("billing", "audit", "crm", "orders", "stock")
)
HELD_ROUTES = ["billing", "orders"]  # of a routed source's queued event held, the route holding its lease

FILL = """
INSERT INTO event_archive (source, key, received_at, event_id, event_type, payload_sha256, body, headers, status,
                           attempts, last_error, completed_at)
SELECT r.source, r.source || ':' || r.event_id, r.received_at, r.event_id, r.event_type, md5(r.event_id),
       convert_to(json_build_object(
           'id', r.event_id, 'type', r.event_type, 'created', extract(epoch FROM r.received_at)::bigint,
           'customer', 'cus_' || (n % $4), 'livemode', true,
           'data', json_build_object('object', json_build_object(
               'id', 'in_' || md5(n::text), 'customer', 'cus_' || (n % $4), 'amount_paid', n % 100000,
               'currency', 'usd', 'lines', json_build_array(json_build_object('price', 'price_' || (n % 37),
                                                                              'quantity', 1 + n % 5)))))::text,
           'UTF8'),
       jsonb_build_object('content-type', 'application/json', 'user-agent', 'bench/1.0',
                          'x-signature', md5(n::text || 'sig')),
       r.status, CASE WHEN r.status = 'processed' THEN 1 ELSE 1 + n % 5 END,
       CASE WHEN r.status IN ('dead', 'retrying') THEN 'RuntimeError: upstream said 503' END,
       CASE WHEN r.status = 'processed' THEN r.received_at + interval '150 milliseconds' END
FROM generate_series($1::int, $2::int) AS n
CROSS JOIN LATERAL (SELECT
    ($5::text[])[1 + n % array_length($5::text[], 1)] AS source,
    'evt_' || substr(md5(n::text), 1, 20) AS event_id,
    $3::timestamptz - (n::float8 / $6 * $7) * interval '1 second' AS received_at,
    CASE WHEN n % 100 = 0 THEN 'dead' WHEN n % 50 = 1 THEN 'duplicate' WHEN n % 500 = 2 THEN 'retrying'
         WHEN n % 97 = 3 THEN 'queued' ELSE 'processed' END AS status) s
CROSS JOIN LATERAL (SELECT s.*, $8::jsonb -> s.source ->> ((n / 7) % jsonb_array_length($8::jsonb -> s.source))
                           AS event_type) r
"""


# Each archived key's lease rows, as its runs left them (released), half
# the queued events' held: on KEY#ROUTE (one route's, HELD_ROUTES) for a
# source with routes ($1 sources, $2 their routes), on KEY for the others.
FENCES = """
INSERT INTO key_fences (key, token, lease_until)
SELECT f.key, 1, CASE WHEN f.held THEN now() + interval '1 day' END
FROM event_archive a
CROSS JOIN LATERAL (
    SELECT a.key || '#' || r.route AS key,
           a.status = 'queued' AND right(a.event_id, 1) < '8' AND r.route = ANY($3::text[]) AS held
    FROM unnest($1::text[], $2::text[]) AS r(source, route) WHERE r.source = a.source
    UNION ALL
    SELECT a.key, a.status = 'queued' AND right(a.event_id, 1) < '8' WHERE a.source <> ALL($1::text[])) f
ON CONFLICT (key) DO NOTHING
"""


async def main() -> int:
    async with scratch_database("wi_bench_search") as connection:
        now = datetime.now(UTC).replace(microsecond=0)
        filled = await fill(connection, now)
        size = await connection.fetchval(
            "SELECT sum(pg_total_relation_size(relid)) FROM pg_partition_tree('event_archive')"
        )
        print(f"filled {ROWS:,} rows in {filled:.1f} s; the archive on disk: {size / 2**20:,.0f} MiB")
        await measure(connection, now)
    return 0


async def fill(connection: asyncpg.Connection, now: datetime) -> float:
    today = now.date()
    for source in SOURCES:
        await connection.execute(
            "SELECT event_archive_keep($1, $2, $3, $4, $5)",
            source,
            archive.source_table(source),
            today - timedelta(days=30),
            today - timedelta(days=DAYS),
            today + timedelta(days=1),
        )
    started = time.monotonic()
    types = json.dumps(SOURCES)
    for first in range(1, ROWS + 1, BATCH):
        await connection.execute(
            FILL,
            first,
            min(first + BATCH - 1, ROWS),
            now,
            CUSTOMERS,
            list(SOURCES),
            ROWS,
            DAYS * 86_400 - 60,
            types,
            timeout=600,
        )
    await connection.execute(FENCES, *ROUTES.arguments(), HELD_ROUTES, timeout=600)
    await connection.execute("VACUUM ANALYZE event_archive")
    await connection.execute("VACUUM ANALYZE key_fences")
    return time.monotonic() - started


def searches(now: datetime) -> list[tuple[str, EventFilter]]:
    yesterday = now - timedelta(days=1)
    return [
        ("newest first, no filter", EventFilter()),
        (
            "source + 1 h window (yesterday)",
            EventFilter(source="stripe", since=yesterday, until=yesterday + timedelta(hours=1)),
        ),
        ("source + type", EventFilter(source="stripe", event_type="invoice.paid")),
        ("type alone", EventFilter(event_type="orders/paid")),
        ("status dead", EventFilter(status="dead")),
        ("status processing", EventFilter(status="processing")),
        ("status queued", EventFilter(status="queued")),
        ("source + status processing", EventFilter(source="stripe", status="processing")),
        ("key prefix", EventFilter(key="stripe:evt_ab1")),
        ("event id prefix", EventFilter(event_id="evt_ab1")),
        ("payload containment (one customer)", EventFilter(payload='{"customer": "cus_123"}')),
        (
            "payload + source + 1 day",
            EventFilter(source="stripe", payload='{"customer": "cus_123"}', since=yesterday, until=now),
        ),
    ]


async def measure(connection: asyncpg.Connection, now: datetime) -> None:
    store = ArchiveStore(connection)
    print(f"\n| {'query':<58} | {'median ms':>9} | {'max ms':>8} | {'runs':>4} | {'rows':>6} | goal {GOAL_MS:.0f} ms |")
    print(f"| {'-' * 58} | {'-' * 9} | {'-' * 8} | {'-' * 4} | {'-' * 6} | {'-' * 12} |")
    missed = []
    for label, where, routes in cases_of(searches(now)):
        try:
            rows = await store.search(where, routes=routes)
        except TimeoutError:  # the store's statement timeout, as the API would meet it
            rows = []
        after = Cursor.below(rows[-1]) if len(rows) == DEFAULT_LIMIT else None
        cases = [
            (
                f"{label}: page 1",
                lambda w=where, r=routes: store.search(w, routes=r),
                "search_archive",
                where,
                None,
                routes,
            ),
            (
                f"{label}: count (cap {COUNT_CAP:,})",
                lambda w=where, r=routes: store.count(w, routes=r),
                "count_archive",
                where,
                None,
                routes,
            ),
        ]
        if after is not None:
            cases.append(
                (
                    f"{label}: next page",
                    lambda w=where, a=after, r=routes: store.search(w, a, routes=r),
                    "search_archive",
                    where,
                    after,
                    routes,
                )
            )
        for name, run, query, case_where, case_after, case_routes in cases:
            try:
                median, most, runs, result = await timed(run)
            except TimeoutError:
                print(
                    f"| {name:<58} | {'> ' + str(STATEMENT_SECONDS):>9} | {'timeout':>8} | {1:>4}"
                    f" | {'-':>6} | {'MISSED':<12} |"
                )
                missed.append((name, await plan(connection, query, case_where, case_after, case_routes, analyze=False)))
                continue
            size = len(result) if isinstance(result, list) else result
            ok = most < GOAL_MS
            print(
                f"| {name:<58} | {median:>9.1f} | {most:>8.1f} | {runs:>4} | {size:>6}"
                f" | {'ok' if ok else 'MISSED':<12} |"
            )
            if not ok:
                missed.append((name, await plan(connection, query, case_where, case_after, case_routes)))
    for name, lines in missed:
        print(f"\nEXPLAIN of {name}:")
        print("\n".join(f"  {line}" for line in lines))


def cases_of(searched: list[tuple[str, EventFilter]]) -> list[tuple[str, EventFilter, SourceRoutes]]:
    """Each search given the sources file's routes; a status search also
    without (what it costs when a routed event's leases are not read)."""
    cases = []
    for label, where in searched:
        cases.append((label, where, ROUTES))
        if where.status in ("processing", "queued"):
            cases.append((f"{label} (routes unknown)", where, NO_ROUTES))
    return cases


async def timed(run) -> tuple[float, float, int, object]:
    took: list[float] = []
    result = None
    while len(took) < RUNS and (len(took) < MIN_RUNS or sum(took) < BUDGET_MS):
        started = time.perf_counter()
        result = await run()
        took.append((time.perf_counter() - started) * 1000)
    return statistics.median(took), max(took), len(took), result


async def plan(
    connection: asyncpg.Connection,
    query: str,
    where: EventFilter,
    after: Cursor | None,
    routes: SourceRoutes,
    analyze: bool = True,
) -> list[str]:
    """The plan of the statement for this filter (EXPLAIN ANALYZE; EXPLAIN
    alone for one that timed out): its first nodes, not its partitions' repeats."""
    arguments = [*where.arguments()]
    if query == "search_archive":
        arguments += [after.received_at, after.source, after.key, after.arrival] if after else [None] * 4
        arguments.append(DEFAULT_LIMIT)
    else:
        arguments.append(COUNT_CAP)
    arguments += routes.arguments()
    lines = [
        row[0]
        for row in await connection.fetch(
            f"EXPLAIN ({'ANALYZE, ' if analyze else ''}COSTS OFF, SUMMARY ON) {SQL[query]}", *arguments
        )
    ]
    return lines[:14] + [line for line in lines[14:] if "Execution Time" in line]


if __name__ == "__main__":
    asyncio.run(main())
