"""`make chaos CHAOS_ARGS=--ordering`: ordering keys under the same faults
(docs/design.md, "Ordering keys"; issue 38, item 5).

**The plan.** Events are versions of objects: OBJECTS_VERSIONS versions
1..N of each object, the source ordered by `body:object` (one lane per
object: `chaos:OBJECT`). An object's versions go in *groups*: most alone,
sent once the previous group's every answer came back; some two or three
together (in flight at once: no order to keep between them). Each version
runs the chaos recorder (tests/chaos/handler.py: an interval in
`chaos_runs`, its work, maybe an injected retryable failure, the call to
the downstream, `chaos_effects` and `inbox` through `ctx.db`), so every
check of tests/chaos/checks.py and reruns.py holds as for unordered events;
no version is told to fail for good (a dead letter would block its lane).

**What is recorded.** The downstream keeps each call's lane (the object),
version, pid, start and end (tests/chaos/downstream.py). The handler,
`tests.chaos.ordering:record`, first reads through the harness's own
connection which versions of its object have committed their effect (the
moment its run begins), and writes that set with its own effect through
`ctx.db` (`ordering_effects`: committed with the completion, or not at all).

**`check_order`.** For each object, each pair of versions A, B where A was
answered 200 before B was sent (the only pairs docs/design.md promises an
order for):
- `ctx.db`: every committed run of B saw A's effect committed when it
  began; a B committed while A never was is out of order too. Never excused;
- external calls: no call of A reached the downstream after a call of B
  did, unless A's caller was stopped (SIGSTOP) at the moment B's call came
  (or woke within STOPPED_SLACK_SECONDS of it): a holder frozen past its lease
  calls on waking ("Exclusion"), which the design states; counted, allowed.
Lanes left blocked (`ordering_keys.blocked_by`) are reported; one is a
violation unless a version of it was told to fail for good (none is).
"""

import asyncio
import json
import os
import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import combinations

import aiohttp
import asyncpg

from tests.chaos import downstream
from tests.chaos import handler as chaos_handler
from tests.chaos.checks import Verdict
from tests.chaos.downstream import Call
from tests.chaos.plan import Plan, PlannedEvent, Request, make_plan
from tests.chaos.traffic import PROVIDER_RETRIES, Sent, record_answer
from webhook_ingest.shared import signatures

VERSIONS = 10  # versions of each object; objects = events // VERSIONS
TOGETHER_SHARE = 0.2  # of groups: two or three versions sent together
FAIL_FIRST_SHARE = 0.1  # of versions: a retryable failure on the first attempts (retried in place)

ORDERING_TABLES = """
CREATE TABLE IF NOT EXISTS ordering_effects (
    object text NOT NULL, version integer NOT NULL, key text NOT NULL, pid integer NOT NULL,
    saw integer[] NOT NULL,   -- the object's versions whose effect had committed when this run began
    at timestamptz NOT NULL DEFAULT clock_timestamp());
"""


# -- the plan ---------------------------------------------------------------------


@dataclass
class OrderedPlan:
    plan: Plan  # events, requests (each at its group's planned time) and faults, as tests/chaos/plan.py's
    groups: dict[str, list[list[Request]]]  # object -> its groups, in order
    versions: dict[str, tuple[str, int]] = field(default_factory=dict)  # event id -> (object, version)


def make_ordered_plan(
    seed: int, events: int, duration: float, faults: bool = True, lock_ttl: float = 3.0
) -> OrderedPlan:
    """The faults of `make_plan` for the same seed (no replays: a replay by
    selection runs in the live lane, another promise); the events drawn
    from a generator of their own."""
    faulted = make_plan(seed, 0, duration, faults=faults, lock_ttl=lock_ttl, replays=False)
    rng = random.Random(f"{seed}/ordering")
    planned, groups, versions = [], {}, {}
    for n in range(max(1, events // VERSIONS)):
        obj = f"obj_{n:04d}"
        at, step, first = rng.uniform(0, duration / 4), 1.5 * duration / VERSIONS, 1
        groups[obj] = []
        while first <= VERSIONS:
            size = rng.choice([2, 3]) if rng.random() < TOGETHER_SHARE else 1
            group = []
            for version in range(first, min(first + size, VERSIONS + 1)):
                event = _event(rng, obj, version)
                planned.append(event)
                versions[event.event_id] = (obj, version)
                group.append(Request(at, event.event_id, event.bodies[0], 0))
            groups[obj].append(group)
            first += len(group)
            at += rng.uniform(0, step)
    requests = sorted((r for object_groups in groups.values() for g in object_groups for r in g), key=lambda r: r.at)
    return OrderedPlan(Plan(seed, planned, requests, faulted.faults, duration), groups, versions)


def _event(rng: random.Random, obj: str, version: int) -> PlannedEvent:
    event = PlannedEvent(f"{obj}_v{version:03d}", "", "ordered")
    fails = rng.random() < FAIL_FIRST_SHARE
    work_ms = rng.randint(5, 100) if rng.random() < 0.95 else rng.randint(300, 1000)
    directive = {"work_ms": work_ms} | downstream.call_directive(rng, may_fail=not fails)
    if fails:
        event.fail = "first"
        directive |= {"fail": "first", "fail_attempts": 1}
    payload = {"id": event.event_id, "type": "chaos.ordered", "object": obj, "version": version, "chaos": directive}
    event.bodies.append(json.dumps(payload).encode())
    return event


# -- sending ----------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    sent: float  # wall clock when its first attempt went out (an attempt that timed out may have been accepted)
    answered: float  # when the last attempt was answered


async def send_groups(
    base_url: str, source: str, secret: str, ordered: OrderedPlan, connections: int = 32
) -> tuple[Sent, dict[str, Timing]]:
    """Each object's groups in order: a group at its planned time, but never
    before every answer of the group before it came back (a 503 retried a
    few times, as a provider does). Returns what came back and, per event
    id, when its first attempt was sent and its last answered."""
    sent, timings = Sent(), {}
    limit = asyncio.Semaphore(connections)
    started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections), timeout=timeout) as session:

        async def one(request: Request) -> None:
            async with limit:
                timings[request.event_id] = await _post(session, f"{base_url}/webhooks/{source}", secret, request, sent)

        async def lane(groups: list[list[Request]]) -> None:
            for group in groups:
                await asyncio.sleep(max(0.0, started + group[0].at - time.monotonic()))
                await asyncio.gather(*(one(request) for request in group))

        await asyncio.gather(*(lane(groups) for groups in ordered.groups.values()))
    return sent, timings


async def _post(session, url: str, secret: str, request: Request, sent: Sent) -> Timing:
    first = time.time()
    for attempt in range(PROVIDER_RETRIES + 1):
        headers = signatures.sign("hmac-sha256", request.body, secret) | {"Content-Type": "application/json"}
        try:
            async with session.post(url, data=request.body, headers=headers) as response:
                status, body = response.status, await response.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            status, body = 0, {"error": type(exc).__name__}
        if status not in (0, 503) or attempt == PROVIDER_RETRIES:
            break
        await asyncio.sleep(0.5 * (attempt + 1))
    record_answer(sent, request, status, body)
    return Timing(first, time.time())


# -- the handler ------------------------------------------------------------------


async def record(event, ctx):
    """What versions of its object had committed as the run began, then the
    chaos recorder's run, then that set with the effect through `ctx.db`."""
    payload = event.payload
    obj, version = str(payload.get("object")), int(payload.get("version", 0))
    runs_database_url = ctx.options.get("runs_database_url") or os.environ["DATABASE_URL"]
    saw = await chaos_handler.harness_statement(
        runs_database_url,
        "SELECT coalesce(array_agg(version), '{}') FROM ordering_effects WHERE object = $1",
        obj,
    )
    await chaos_handler.record(event, ctx)
    await ctx.db.execute(
        "INSERT INTO ordering_effects (object, version, key, pid, saw) VALUES ($1, $2, $3, $4, $5)",
        obj,
        version,
        event.key,
        os.getpid(),
        list(saw),
    )


# -- what the database shows ---------------------------------------------------------


@dataclass(frozen=True)
class Effect:
    pid: int
    saw: frozenset[int]


@dataclass(frozen=True)
class BlockedLane:
    lane: str
    dead_letter_id: int
    age_seconds: float
    waiting: int


async def observe(database_url: str) -> tuple[dict[str, list[Effect]], list[BlockedLane]]:
    """Committed effects by key, and the lanes left blocked."""
    connection = await asyncpg.connect(database_url)
    try:
        effects: dict[str, list[Effect]] = defaultdict(list)
        for row in await connection.fetch("SELECT key, pid, saw FROM ordering_effects"):
            effects[row["key"]].append(Effect(row["pid"], frozenset(row["saw"])))
        blocked = [
            BlockedLane(row["lane"], row["blocked_by"], float(row["age"]), row["pending"])
            for row in await connection.fetch(
                "SELECT lane, blocked_by, pending, extract(epoch FROM now() - blocked_since) AS age"
                " FROM ordering_keys WHERE blocked_by IS NOT NULL ORDER BY lane"
            )
        ]
    finally:
        await connection.close()
    return effects, blocked


# -- the check ----------------------------------------------------------------------


@dataclass(frozen=True)
class Version:
    """One accepted version: its object (the lane's value), number, key and timing."""

    obj: str
    version: int
    key: str
    sent: float
    answered: float


def accepted_versions(ordered: OrderedPlan, sent: Sent, timings: dict[str, Timing]) -> list[Version]:
    return [
        Version(obj, version, sent.accepted[event_id], timings[event_id].sent, timings[event_id].answered)
        for event_id, (obj, version) in ordered.versions.items()
        if event_id in sent.accepted and event_id in timings
    ]


@dataclass
class OrderTally:
    pairs: int = 0  # (A, B) pairs with an order to keep
    lanes: int = 0
    calls_inverted_while_stopped: int = 0
    blocked: list[BlockedLane] = field(default_factory=list)

    def lines(self) -> list[str]:
        blocked = "; ".join(
            f"{lane.lane} by dead letter {lane.dead_letter_id} for {lane.age_seconds:.0f}s, {lane.waiting} waiting"
            for lane in self.blocked
        )
        return [
            f"ordering   {self.lanes} lanes, {self.pairs} ordered pairs checked; external calls inverted by a"
            f" stopped holder (allowed): {self.calls_inverted_while_stopped}",
            f"blocked    {len(self.blocked)} lane(s){': ' + blocked if blocked else ''}",
        ]


def check_order(
    versions: Iterable[Version],
    effects: dict[str, list[Effect]],
    calls: Iterable[Call],
    stopped_at: Callable[[int, float], bool],
    blocked: list[BlockedLane],
    verdict: Verdict,
    lane_of: Callable[[str], str] = lambda obj: f"chaos:{obj}",
    may_block: frozenset[str] = frozenset(),
) -> OrderTally:
    """The order promise (see the module's docstring) over every object's
    accepted versions; violations go into `verdict`, the rest into the tally.
    `stopped_at(pid, moment)`: Observed.stopped_at (the run's pauses);
    `may_block`: lanes with a version told to fail for good."""
    tally = OrderTally(blocked=list(blocked))
    by_object: dict[str, list[Version]] = defaultdict(list)
    for version in versions:
        by_object[version.obj].append(version)
    calls_of: dict[tuple[str, int], list[Call]] = defaultdict(list)
    for call in calls:
        calls_of[call.lane, call.version].append(call)
    for obj, accepted in sorted(by_object.items()):
        tally.lanes += 1
        for a, b in combinations(sorted(accepted, key=lambda v: (v.sent, v.version)), 2):
            if not a.answered < b.sent:
                continue  # in flight together: no order to keep
            tally.pairs += 1
            _check_effects(obj, a, b, effects, verdict)
            _check_calls(obj, a, b, calls_of, stopped_at, verdict, tally)
    for lane in blocked:
        if lane.lane not in may_block:
            verdict.violate(
                "lane blocked",
                f"{lane.lane}: blocked by dead letter {lane.dead_letter_id} for {lane.age_seconds:.0f}s,"
                f" {lane.waiting} waiting; no version of it was told to fail for good",
            )
    return tally


def _check_effects(obj: str, a: Version, b: Version, effects: dict[str, list[Effect]], verdict: Verdict) -> None:
    later = effects.get(b.key, [])
    if later and not effects.get(a.key):
        verdict.violate(
            "ran past an unfinished version",
            f"{obj}: version {b.version} committed, version {a.version} (answered before it was sent) never did",
        )
        return
    for effect in later:
        if a.version not in effect.saw:
            verdict.violate(
                "ctx.db effects out of order",
                f"{obj}: version {b.version}'s run (pid {effect.pid}) began before version {a.version}'s effect"
                f" committed, although {a.version} was answered {b.sent - a.answered:.3f}s before {b.version} was sent",
            )


def _check_calls(
    obj: str,
    a: Version,
    b: Version,
    calls_of: dict[tuple[str, int], list[Call]],
    stopped_at: Callable[[int, float], bool],
    verdict: Verdict,
    tally: OrderTally,
) -> None:
    later = calls_of.get((obj, b.version), [])
    if not later:
        return
    first_later = min(call.started for call in later)
    for call in calls_of.get((obj, a.version), []):
        if call.started <= first_later:
            continue
        if stopped_at(call.pid, first_later):
            tally.calls_inverted_while_stopped += 1
        else:
            verdict.violate(
                "external calls out of order",
                f"{obj}: a call of version {a.version} (pid {call.pid}) came {call.started - first_later:.3f}s after"
                f" version {b.version}'s first, its caller not stopped then",
            )
