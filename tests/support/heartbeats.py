"""Worker heartbeat rows and per-minute outcomes, seeded straight into a
test's database (shared/worker_heartbeats.py): the console's overview
drawn from known figures."""

from datetime import UTC, datetime

import asyncpg

from webhook_ingest.shared.worker_heartbeats import Counts, Figures, HeartbeatStore, Identity

HOST = "node-a"


async def seed_workers(database_url: str) -> dict[str, str]:
    """Four workers of 5 s beats — live, degraded, silent (last beat 40 s
    ago), stopped — and an hour of outcomes; {state: worker_id}."""
    connection = await asyncpg.connect(database_url)
    try:
        store = HeartbeatStore(connection)
        ids = {}
        for pid, state in enumerate(("live", "degraded", "silent", "stopped"), start=101):
            who = Identity("worker", HOST, pid, datetime.now(UTC))
            figures = Figures(
                in_flight=12 if state != "stopped" else 0,
                keys_held=9 if state != "stopped" else 0,
                pool_in_use=3,
                pool_size=26,
                degraded=state == "degraded",
            )
            await store.beat(
                who, 5.0, figures, Counts(lease_losses=2 if state == "silent" else 0), stopped=state == "stopped"
            )
            ids[state] = who.worker_id
        await connection.execute(
            "UPDATE worker_heartbeats SET last_seen = now() - interval '40 seconds' WHERE worker_id = $1", ids["silent"]
        )
        await connection.execute(HOUR_OF_OUTCOMES, ids["live"])
    finally:
        await connection.close()
    return ids


# A working hour with a burst of retries and dead letters 20 minutes ago
# (a downstream outage) and copies all along.
HOUR_OF_OUTCOMES = """
INSERT INTO worker_minutes (minute, worker_id, processed, retried, dead, duplicate)
SELECT date_trunc('minute', now()) - n * interval '1 minute', $1,
       40 + (n * 7) % 23 - CASE WHEN n BETWEEN 18 AND 22 THEN 30 ELSE 0 END,
       CASE WHEN n BETWEEN 18 AND 22 THEN 25 - n % 3 ELSE n % 4 END,
       CASE WHEN n BETWEEN 19 AND 21 THEN 6 ELSE 0 END,
       (n * 3) % 5
FROM generate_series(1, 59) AS n
ON CONFLICT (minute, worker_id) DO UPDATE SET processed = EXCLUDED.processed, retried = EXCLUDED.retried,
    dead = EXCLUDED.dead, duplicate = EXCLUDED.duplicate
"""
