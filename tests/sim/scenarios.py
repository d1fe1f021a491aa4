"""Hand-written plans for what the simulator must find (issue 26, item 5):
each reproduces a known finding whatever the seed's latencies, so a test
built on one does not drift with the scheduling the way a drawn seed can.

- `issue20`: 300 events queued while no worker runs (a backlog), two
  workers at `run`'s defaults (256 in flight), handlers of ~300 ms that
  call the outside world (`forward`) or write through ctx.db, no fault of
  any kind. Before the fix of issue 20 (2c5879a): runs end LockLost and run
  again, and deferrals acked as their own leader's copies are lost.
- `b4`: finding B4 — a worker stopped (SIGTERM) while its failed attempt's
  retry waits for a blocked broker's confirm (a memory alarm): its grace
  ends, the wait is cancelled, the message comes back and the attempt runs
  again. Attempts are at least once by design: only the strict invariant
  ("each attempt runs at most once") calls it a violation.
- `b6`: finding B6 — a worker cut from Postgres after its failed attempt's
  retry was confirmed cannot record the attempt handed on nor keep its
  lease; a copy of the event on another worker runs the attempt again.
- `two_payloads`: finding F1, the simulator's own (`tests/sim/known.py`).
- `redis_forgets`: a run refused for its Redis lock alone (fixed: the lease decides).
"""

from tests.sim.plan import Config, Plan, Send, Step


def issue20(seed: int = 20, source: str = "ext") -> Plan:
    sends = [Send(0.0, event, source) for event in range(300)]
    return Plan(seed=seed, config=Config(workers=2, concurrency=256), sends=sends, mix="slow")


def b4(seed: int = 4) -> Plan:
    config = Config(workers=1, concurrency=1, grace_seconds=2.0, max_attempts=3, retry_delays=(0.5,))
    return Plan(
        seed=seed,
        config=config,
        sends=[Send(0.0, 0, "ext")],
        scripted={"0": [0.3, "retry"]},
        steps=[Step("amqp_alarm", 0.1, 20.0), Step("stop", 0.5, 0.0, 0, 0.5)],
    )


def b6(seed: int = 6) -> Plan:
    """Two events, one on each worker (one in flight each); worker 0's
    Postgres stalls before they fail; their copies then reach worker 1
    alone, as worker 0's window is full with its unacked message."""
    config = Config(workers=2, concurrency=1, max_attempts=2, retry_delays=(8.0,))
    sends = [Send(0.0, event, "ext") for event in (0, 1)] + [Send(6.0, event, "ext") for event in (0, 1)]
    return Plan(
        seed=seed,
        config=config,
        sends=sends,
        scripted={"0": [2.0, "retry"], "1": [2.0, "retry"]},
        steps=[Step("pg_stall", 1.5, 10.0, 0, 0)],
    )


def two_payloads(seed: int = 2) -> Plan:
    """Found by the simulator (seed 2002, no fault): two payloads under one
    key, each failing its first attempt for good, then a copy of the second.
    The key's attempt record holds one payload and only moves forward, so
    the second payload's attempt 1 is never recorded handed on: its copy
    runs attempt 1 again although its dead letter is open."""
    config = Config(workers=1, concurrency=4, max_attempts=1)
    sends = [Send(0.0, 0, "ext"), Send(0.05, 0, "ext", variant=1), Send(0.5, 0, "ext", variant=1)]
    return Plan(seed=seed, config=config, sends=sends, scripted={"0": [0.01, "permanent"]})


def redis_forgets(seed: int = 54) -> Plan:
    """Shrunk from seed 54 (--strict-attempts): one Redis flush while a
    2.4 s handler that calls the outside world runs. Its Redis lock cannot
    be renewed and counts as lost; the run was refused at its end although
    its Postgres lease — the exclusion that holds whatever Redis forgets —
    was kept throughout, and the handler ran again: one fault, two
    external calls. Now the lease alone decides (docs/design.md, "A lock
    that cannot be kept")."""
    return Plan(
        seed=seed,
        config=Config(workers=1),
        sends=[Send(0.0, 0, "ext")],
        scripted={"0": [2.4, None]},
        steps=[Step("redis_flush", 0.25, 0.0)],
    )


def pause_within_margin(seed: int = 33, pause_at: float = 3.15) -> Plan:
    """The lease's margin at work (docs/design.md, "A lock that cannot be kept"): worker 1 is
    stopped at first, so the event goes to worker 0; worker 0's Postgres
    stalls under its 6 s handler, so its lease cannot be renewed and runs
    out on the server 3 s after it was taken; worker 0 is then paused for
    0.65 s (a GC pause) from just before that. Its keeper cancels the
    handler a third of the lease earlier, before the pause, so when the
    copy on worker 1 takes the lease the first run is over. Without the
    margin the cancellation waits out the pause, and the two runs overlap."""
    config = Config(workers=2, concurrency=1)
    return Plan(
        seed=seed,
        config=config,
        sends=[Send(0.2, 0, "ext"), Send(1.0, 0, "ext")],
        scripted={"0": [6.0, None]},
        steps=[Step("stop", 0.0, 0.0, 1, 0.3), Step("pg_stall", 0.5, 10.0, 0, 0), Step("pause", pause_at, 0.65, 0)],
    )


def paused_holder(seed: int = 35, pause: float = 2.5) -> Plan:
    """Issue 35, finding 1: one worker at its defaults (lock TTL 3 s), 40
    events whose handler calls the outside world for ~300 ms, the worker
    stopped (SIGSTOP) for 2.5 s, within its lease, once the first have
    run. No copy arrives and no other worker runs: every run it repeats
    after the pause is one it gave up on its own timer (before e0c9f92's
    merge, 4fbfded: 36 repeated here)."""
    sends = [Send(0.0, event, "ext") for event in range(40)]
    return Plan(
        seed=seed,
        config=Config(workers=1, concurrency=256),
        sends=sends,
        mix="slow",
        steps=[Step("pause", 0.2, pause, 0)],
    )


def crossed_locks(seed: int = 3, events: int = 60) -> Plan:
    """Issue 35, finding 3: two workers hold many leases at once under
    handlers of 2 s, so each renews them in one statement every second;
    a copy of every event reaches the other worker meanwhile, whose one
    statement tries to take all their leases. take_leases locks the fence
    rows in key order, a renewal (before a160847) in the plan's: Postgres
    finds the cycle and ends one of them with DeadlockDetectedError."""
    sends = [Send(0.0, event, "ext") for event in range(events)]
    sends += [Send(round(0.6 + 0.01 * event, 4), event, "ext") for event in range(events)]
    return Plan(
        seed=seed,
        config=Config(workers=2, concurrency=64),
        sends=sends,
        scripted={str(event): [2.0, None] for event in range(events)},
        steps=[Step("redis_flush", 0.5, 0.0)],
    )


def routed(seed: int = 5, events: int = 40) -> Plan:
    """Route fan-out beside issue 35's faults: 40 events of a source with
    two routes (one calls the outside world, one writes through ctx.db),
    a copy of each, two workers, one paused 2.5 s and the other's loop
    lagging: each route's run settles once, none repeated."""
    sends = [Send(round(0.01 * event, 4), event, "fan") for event in range(events)]
    sends += [Send(round(1.0 + 0.02 * event, 4), event, "fan") for event in range(events)]
    return Plan(
        seed=seed,
        config=Config(workers=2, concurrency=64),
        sends=sends,
        mix="slow",
        routed=1.0,
        steps=[Step("pause", 0.5, 2.5, 0), Step("lag", 0.3, 3.0, 1, 0.01)],
    )


def replays(seed: int = 8, events: int = 30) -> Plan:
    """Replays arriving beside the traffic: 30 events (a third of them
    routed), every fifth refused for good (a dead letter), copies of every
    event from 2 s on; at 2 s a bulk replay of every open dead letter and a
    replay by selection of every event at once, two workers, one paused
    2.5 s meanwhile."""
    sources = ("ext", "db", "fan")
    sends = [Send(round(0.01 * event, 4), event, sources[event % 3]) for event in range(events)]
    sends += [Send(round(2.0 + 0.01 * event, 4), event, sources[event % 3]) for event in range(events)]
    return Plan(
        seed=seed,
        config=Config(workers=2, concurrency=64, max_attempts=1),
        sends=sends,
        mix="slow",
        routed=1 / 3,
        scripted={str(event): [0.3, "permanent"] for event in range(0, events, 5)},
        steps=[Step("bulk_replay", 2.0), Step("event_replay", 2.0), Step("pause", 1.9, 2.5, 1)],
    )


SCENARIOS = {
    "pause_within_margin": pause_within_margin,
    "paused_holder": paused_holder,
    "crossed_locks": crossed_locks,
    "issue20": issue20,
    "b4": b4,
    "b6": b6,
    "two_payloads": two_payloads,
    "redis_forgets": redis_forgets,
    "routed": routed,
    "replays": replays,
}
