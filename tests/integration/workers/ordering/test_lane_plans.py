"""extend_lanes reads `ordering_keys` by its index whatever plan Postgres
keeps for it, as the fence statements do (tests/integration/workers/claim/
test_fence_plans.py): prepared once a session, a generic plan made while
the table was small (a new deployment) must not scan every lane at each
renewal as the table grows by a lane an ordering key."""

import asyncpg
import pytest

from webhook_ingest.workers.ordering.store import SQL


@pytest.mark.xfail(strict=True, reason="extend_lanes' generic plan joins ordering_keys by a sequential scan")
async def test_a_generic_plan_made_over_a_small_table_reads_lanes_by_their_index(database):
    connection = await asyncpg.connect(database)
    try:
        await connection.execute(
            "INSERT INTO ordering_keys (lane, source, token, lease_until)"
            " SELECT 'acme:obj_' || n, 'acme', n, now() + interval '1 hour' FROM generate_series(1, 100) AS n"
        )
        await connection.execute("SET plan_cache_mode = force_generic_plan")
        await connection.execute(f"PREPARE lane_statement AS {SQL['extend_lanes']}")
        plan = "\n".join(
            row[0] for row in await connection.fetch("EXPLAIN EXECUTE lane_statement('{acme:obj_1}', '{1}', 3000)")
        )
    finally:
        await connection.close()
    assert "ordering_keys_pkey" in plan and "Seq Scan on ordering_keys" not in plan, plan
