"""Everything a run will do, drawn from one seed before it starts: the
events and their copies (with send times), and the fault schedule. Pure
code: the same seed and sizes give the same plan.
"""

import json
import random
from dataclasses import dataclass, field

from tests.chaos import downstream

MAX_ATTEMPTS = 3
UNTIL_REPLAYED_SHARE = 0.5  # of the events told to fail for good: until a dead-letter replay runs them instead
RETRY_DELAYS = (0.2, 0.5)


@dataclass(frozen=True)
class Request:
    at: float  # seconds after the traffic starts
    event_id: str
    body: bytes
    variant: int  # 0: the original payload; 1: another payload for the same id (a conflict)


@dataclass
class PlannedEvent:
    event_id: str
    fail: str  # "", "permanent", "always", "first" or "until_replayed"
    kind: str  # "plain", "unicode", "bigint", "deep", "conflict" or "unstorable"
    bodies: list[bytes] = field(default_factory=list)

    @property
    def expect_dead_letter(self) -> bool:
        """`until_replayed` too, unless a dead-letter replay ran it (tests/chaos/replays.py)."""
        return self.fail in ("permanent", "always", "until_replayed")

    @property
    def must_be_refused(self) -> bool:
        """A lone surrogate escape: jsonb cannot hold it, so 400 at the door (docs/reference.md §6)."""
        return self.kind == "unstorable"


@dataclass(frozen=True)
class Fault:
    at: float
    action: str  # "kill", "cut", "flush", "prune", "pause", "hog", "replay" or "dlq-replay"
    worker: int = -1
    service: str = ""  # for "cut": "redis", "postgres" or "rabbitmq"
    seconds: float = 0.0  # how long a cut, pause or hog lasts, a killed worker stays down, a replay's window

    def describe(self) -> str:
        match self.action:
            case "kill":
                return f"SIGKILL worker {self.worker}, restart after {self.seconds:.1f}s"
            case "cut":
                return f"cut worker {self.worker}'s {self.service} for {self.seconds:.1f}s"
            case "flush":
                return "FLUSHALL the Redis"
            case "pause":
                return f"SIGSTOP worker {self.worker}, SIGCONT after {self.seconds:.1f}s"
            case "hog":
                return f"a CPU hog for {self.seconds:.1f}s"
            case "replay":
                return f"webhook-ingest events replay of a {self.seconds:.1f}s window"
            case "dlq-replay":
                return "webhook-ingest dlq replay --all"
            case _:
                return "webhook-ingest prune --older-than 1s"


@dataclass
class Plan:
    seed: int
    events: list[PlannedEvent]
    requests: list[Request]
    faults: list[Fault]
    duration: float


def make_plan(
    seed: int,
    events: int,
    duration: float,
    workers: int = 3,
    degraded_worker: int | None = 2,
    faults: bool = True,
    id_prefix: str = "",
    lock_ttl: float = 3.0,
    replays: bool = True,
) -> Plan:
    """`id_prefix` keeps one run's event ids apart from every other's (a staging database is not fresh).

    What issue 35 added (each event's downstream call, failures until a
    dead-letter replay, pauses, CPU hogs, replays) is drawn from a second
    generator of the same seed: the events, copies and faults drawn before
    stay what they were for every seed. `replays=False` draws neither the
    replays nor the events that fail until a dead-letter replay."""
    from tests.chaos import pauses  # they build on this module's Fault
    from tests.chaos import replays as replays_module

    rng, more = random.Random(seed), random.Random(f"{seed}/issue-35")
    planned = [_event(rng, n, id_prefix, more, replays) for n in range(events)]
    requests = sorted((r for event in planned for r in _requests(rng, event, duration)), key=lambda r: r.at)
    schedule = _faults(rng, duration, workers, degraded_worker) if faults else []
    if faults:
        drawn = pauses.draw(more, duration, workers, lock_ttl)
        replay_faults = replays_module.draw(more, duration)  # drawn either way: the same seed, the same pauses
        schedule = sorted(schedule + drawn + (replay_faults if replays else []), key=lambda fault: fault.at)
    return Plan(seed, planned, requests, schedule, duration)


def _event(rng: random.Random, n: int, id_prefix: str, more: random.Random, replays: bool = True) -> PlannedEvent:
    event_id = f"{id_prefix}evt_{n:05d}"
    kind = rng.choices(["plain", "unicode", "bigint", "deep", "conflict", "unstorable"], weights=[60, 8, 6, 4, 8, 3])[0]
    fail = (
        ""
        if kind in ("conflict", "unstorable")
        else rng.choices(["", "permanent", "always", "first"], weights=[80, 4, 4, 12])[0]
    )
    if fail == "permanent" and more.random() < UNTIL_REPLAYED_SHARE and replays:
        fail = "until_replayed"
    event = PlannedEvent(event_id, fail, kind)
    directive = {"work_ms": _work_ms(rng)} | downstream.call_directive(more, may_fail=not fail)
    if fail:
        directive |= {"fail": fail, "fail_attempts": rng.randint(1, MAX_ATTEMPTS - 1)}
    event.bodies.append(_body(rng, event, directive, variant=0))
    if kind == "conflict":
        event.bodies.append(_body(rng, event, directive, variant=1))
    return event


def _work_ms(rng: random.Random) -> int:
    """How long a run waits, as real handlers wait on the network: 90 % of
    them 5-300 ms (an API call), 10 % 1-3 s (a slow one)."""
    return rng.randint(5, 300) if rng.random() < 0.9 else rng.randint(1000, 3000)


def _body(rng: random.Random, event: PlannedEvent, directive: dict, variant: int) -> bytes:
    payload = {"id": event.event_id, "type": "chaos.test", "chaos": directive, "amount": 100 + variant}
    match event.kind:
        case "unicode":
            payload["note"] = "caf\u00e9 \u0645\u0631\u062d\u0628\u0627 \U0001f600 \u200b\u2028 \U0010ffff"
        case "bigint":
            payload["big"] = rng.choice([2**63, 2**64 + 1, 10**30, -(10**40)])
        case "deep":
            payload["nested"] = _nest(rng.randint(50, 300))
        case "unstorable":
            payload["note"] = "half an emoji: \ud83d"
            return json.dumps(payload).encode()  # ASCII escapes: "\ud83d" on the wire
    return json.dumps(payload, ensure_ascii=False).encode()


def _nest(depth: int) -> object:
    value: object = "bottom"
    for level in range(depth):
        value = {"l": level, "v": [value]} if level % 2 else [value]
    return value


def _requests(rng: random.Random, event: PlannedEvent, duration: float) -> list[Request]:
    """Several copies; most sent together (in flight at once), some later."""
    first = rng.uniform(0, duration)
    copies = 1 if event.must_be_refused else rng.choice([1, 2, 2, 3, 3, 4])
    requests = []
    for copy in range(copies + (len(event.bodies) - 1)):
        at = first + (rng.uniform(0, 0.2) if rng.random() < 0.8 else rng.uniform(0, duration - first))
        variant = 1 if copy >= copies else 0
        requests.append(Request(at, event.event_id, event.bodies[variant], variant))
    return requests


def _faults(rng: random.Random, duration: float, workers: int, degraded_worker: int | None) -> list[Fault]:
    schedule, at = [], rng.uniform(0.5, 2.0)
    while at < duration:
        schedule.append(_fault(rng, at, workers, degraded_worker))
        at += rng.expovariate(1 / 1.5)
    return schedule


def _fault(rng: random.Random, at: float, workers: int, degraded_worker: int | None) -> Fault:
    action = rng.choices(["kill", "cut", "flush", "prune"], weights=[3, 6, 1, 1])[0]
    worker = rng.randrange(workers)
    match action:
        case "kill":
            return Fault(at, "kill", worker, seconds=rng.uniform(0.2, 2.0))
        case "cut":
            services = ["postgres", "rabbitmq"] + (["redis"] if worker != degraded_worker else [])
            return Fault(at, "cut", worker, rng.choice(services), seconds=rng.uniform(1.0, 5.0))
    return Fault(at, action)
