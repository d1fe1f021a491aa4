"""What each index of the event archive costs on the write path (issue 22,
item 4; docs/performance.md, "Searching a million archived events"). The
Postgres backend's CPU per event for the archive's two writes of an event,
as the processes make them: its arrival (ArchiveStore.write_arrivals, the
ingress's batch) and its outcome `processed` (write_outcomes, the
workers'), with every index, and with one dropped at a time. `python -m
tests.bench.archive_index_cost`; not part of `make bench`.

One throwaway database per variant and round, migrated, the variant's
indexes dropped, WARM_UP events then EVENTS events of ~1 KiB (the
`archive` phase's bodies) in batches of BATCH; the variants in turn, then in
reverse order (ROUNDS), the median per variant. The backend's CPU is read
from /proc (Postgres runs on this machine), so nothing but the archive's
statements is counted. Each database is dropped at the end.
"""

import asyncio
import os
import statistics
import time
from dataclasses import replace
from datetime import timedelta

import orjson

from tests.bench.cpu import cpu_seconds
from tests.bench.deployment import scratch_database
from tests.bench.httpload import BODY_BYTES
from tests.support.events import make_event
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.archive.store import ArchiveStore

EVENTS, WARM_UP, ROUNDS = 10_000, 1_000, 2
BATCH = int(os.environ.get("BENCH_ARCHIVE_BATCH", "100"))  # rows a statement: the writers' batches at the rate
SOURCE = "kept"
SEARCH = [
    "event_archive_type",
    "event_archive_status",
    "event_archive_event_id_prefix",
]  # 0019's, the key's gone (0024)
VARIANTS = {  # name -> the indexes dropped
    "every index": [],
    **{f"without {index}": [index] for index in SEARCH},
    "without 0019's three": SEARCH,
    "without the payload GIN (0016)": ["event_archive_payload_gin"],
    "without 0016 and 0019": [*SEARCH, "event_archive_payload_gin"],
}


def events(prefix: str, count: int) -> list:
    padded = []
    for n in range(count):
        event = make_event(SOURCE, f"{prefix}{n}", {"type": "bench.event", "pad": ""})
        body = orjson.loads(event.body)
        body["pad"] = "x" * (BODY_BYTES - len(event.body))
        padded.append(replace(event, body=orjson.dumps(body)))
    return padded


async def write(store: ArchiveStore, batch: list) -> None:
    await store.write_arrivals([archive.arrival_row(event, "bench.event", "{}", archive.QUEUED) for event in batch])
    await store.write_outcomes([archive.outcome_row(event, archive.PROCESSED, time.time()) for event in batch])


SIZES = """
SELECT parent.indexrelid::regclass::text, sum(pg_relation_size(tree.relid))
FROM pg_index parent, pg_partition_tree(parent.indexrelid) tree
WHERE parent.indrelid = 'event_archive'::regclass GROUP BY 1 ORDER BY 1"""


async def one_run(dropped: list[str], sizes: dict[str, float]) -> float:
    """Backend CPU µs per event with `dropped` gone; `sizes` gets each
    index's bytes per event."""
    async with scratch_database("wi_bench_index") as connection:
        for index in dropped:
            await connection.execute(f"DROP INDEX {index}")
        store = ArchiveStore(connection)
        await store.keep({SOURCE: timedelta(days=7)})
        warm, measured = events("warm_", WARM_UP), events("evt_", EVENTS)
        for first in range(0, WARM_UP, BATCH):
            await write(store, warm[first : first + BATCH])
        pid = await connection.fetchval("SELECT pg_backend_pid()")
        before = cpu_seconds(pid)
        for first in range(0, EVENTS, BATCH):
            await write(store, measured[first : first + BATCH])
        spent = cpu_seconds(pid) - before
        sizes.update({index: size / (WARM_UP + EVENTS) for index, size in await connection.fetch(SIZES)})
        return spent / EVENTS * 1e6


async def main() -> None:
    taken: dict[str, list[float]] = {name: [] for name in VARIANTS}
    sizes: dict[str, float] = {}
    for round_ in range(ROUNDS):
        for name in VARIANTS if round_ % 2 == 0 else reversed(VARIANTS):
            taken[name].append(await one_run(VARIANTS[name], sizes if name == "every index" else {}))
            print(f"round {round_ + 1}: {name}: {taken[name][-1]:.1f} µs", flush=True)
    every = statistics.median(taken["every index"])
    print(f"\n| {'variant':<40} | {'µs per event':>12} | {'runs':<20} | {'vs every index':>14} |")
    for name, runs in taken.items():
        median = statistics.median(runs)
        print(
            f"| {name:<40} | {median:>12.1f} | {', '.join(f'{run:.1f}' for run in runs):<20}"
            f" | {median - every:>+14.1f} |"
        )
    print("\nbytes on disk per event, each index (every index kept):")
    for index, size in sizes.items():
        print(f"  {index:<40} {size:>8.0f}")


if __name__ == "__main__":
    asyncio.run(main())
