"""The short seeded version of `make chaos` (tests/chaos): a few hundred
requests with copies, conflicts, odd bodies and injected handler errors
through a real ingress to three workers in mixed modes, while a schedule
from the seed kills workers, cuts their Redis/Postgres/RabbitMQ, flushes
Redis and prunes. Every guarantee it checks is listed in tests.chaos.checks.

Each run is made once and judged by two tests: the pipeline's guarantees,
and the event archive's (issue 22: every accepted event in it with its
final status).
"""

import pytest

from tests.chaos.checks import ARCHIVE_VIOLATIONS
from tests.chaos.run import Options, Result, run_local

# alone: three workers at the default concurrency hold ~70 Postgres connections (sampled during a
# .ci/run); beside another test's 30-55 the shared server's 100 run out.
pytestmark = [pytest.mark.slow, pytest.mark.alone]

# Before the worker fixes of issue 10 (e20fd50), this seed failed with 19
# violations: 11 keys run at once by the degraded worker and a Redis-locked
# one, 3 run again just after their effect was written, 2 lone-surrogate
# bodies accepted and then stuck in NS.dead.
SEED = 7
# With the replays `make chaos` draws. CI's run of seed 7 at 7bd0e32 left a copy archived `dead`
# under a dead letter the bulk replay had run to completion (evt_00117: 1 effect, archived 1 dead,
# 1 duplicate, 1 processed): a replay then requeued only the arrival its dead letter named (25c0a7d).
PLAIN = Options(seed=SEED, events=150, duration=12, drain_timeout=60, stall_seconds=20)
ROUTED = Options(seed=SEED, events=100, duration=10, drain_timeout=60, stall_seconds=20, routes=("a", "b"))

# Seed 7 at 08:52 UTC on 2026-11-25 (the archive check's first run): 9 archive
# violations, the pipeline's guarantees all kept. Copies miscounted (6): copies
# the ingress stamped with the same millisecond were one row, until each
# arrival got its own id (migration 0017). Left queued (2): a worker's outcome
# batch waiting for its cut Postgres died with it when it was SIGKILLed, until
# the archive's sweep settled such rows from the completions and dead letters
# (shared/archive/settling.py; the local run's ingress sweeps every 2 s).

_runs: dict[str, Result] = {}


async def seeded(options: Options, namespace, database, tmp_path) -> Result:
    """The run of these options, made by whichever of its tests comes first."""
    name = repr(options)
    if name not in _runs:
        _runs[name] = await run_local(options, namespace=namespace, database_url=database, log_dir=tmp_path)
        print(_runs[name].report)
    return _runs[name]


def pipeline(result: Result) -> list:
    return [violation for violation in result.verdict.violations if violation[0] not in ARCHIVE_VIOLATIONS]


def archived(result: Result) -> list:
    return [violation for violation in result.verdict.violations if violation[0] in ARCHIVE_VIOLATIONS]


async def test_a_seeded_fault_run_keeps_every_guarantee(namespace, database, tmp_path):
    result = await seeded(PLAIN, namespace, database, tmp_path)
    assert not pipeline(result), result.report


async def test_a_seeded_fault_run_archives_every_accepted_event_as_it_ended(namespace, database, tmp_path):
    result = await seeded(PLAIN, namespace, database, tmp_path)
    assert result.verdict.outcomes["archived as it ended"] > 100, result.report  # the archive was judged
    assert not archived(result), result.report


async def test_a_seeded_fault_run_with_routes_runs_each_event_once_per_route(namespace, database, tmp_path):
    """The same faults, the source with two routes (issue 23, item 3): each
    (event, route) pair is judged as an event of its own (KEY#ROUTE)."""
    result = await seeded(ROUTED, namespace, database, tmp_path)
    assert result.verdict.outcomes["completed once"] > 100, result.report  # both routes' runs were judged
    assert not pipeline(result), result.report


async def test_a_seeded_fault_run_with_routes_archives_every_accepted_event(namespace, database, tmp_path):
    result = await seeded(ROUTED, namespace, database, tmp_path)
    assert not archived(result), result.report
