"""The statements that lock several fence rows read `key_fences` by its
index whatever plan Postgres keeps for them (issue 39).

A worker's statements are prepared once per session, and after five runs
Postgres may keep a generic plan, made from the table's size then. Made
while `key_fences` was small (a new deployment, its statistics not yet
gathered), the batch's completion joined the table by a sequential scan:
every fence row read at every batch, the table growing by a row an event
(2-3 ms a batch of 25 at 22,000 rows in the bench's run). Forced generic
plans, made over a table of 100 rows, must not scan it."""

import asyncpg
import pytest

from webhook_ingest.workers.claim.completions import SQL

ARGUMENTS = {
    "complete_events": "'{k}', '{s}', '{e}', '{h}', '{1}', '{1}', '{m}', '{1}', '{NULL}', '{NULL}', '{NULL}', "
    "'{NULL}', '{f}'",
    "extend_leases": "'{k}', '{1}', 3000",
    "release_leases": "'{k}', '{1}'",
}


@pytest.mark.parametrize("name", sorted(ARGUMENTS))
async def test_a_generic_plan_made_over_a_small_table_reads_fence_rows_by_their_index(database, name):
    connection = await asyncpg.connect(database)
    try:
        await connection.execute(
            "INSERT INTO key_fences (key, token, lease_until)"
            " SELECT 'acme:evt_' || n, n, now() + interval '1 hour' FROM generate_series(1, 100) AS n"
        )
        await connection.execute("SET plan_cache_mode = force_generic_plan")
        await connection.execute(f"PREPARE fence_statement AS {SQL[name]}")
        plan = "\n".join(
            row[0] for row in await connection.fetch(f"EXPLAIN EXECUTE fence_statement({ARGUMENTS[name]})")
        )
    finally:
        await connection.close()
    assert "key_fences_pkey" in plan and "Seq Scan on key_fences" not in plan, plan
