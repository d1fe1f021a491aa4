"""What one simulated run does, drawn from its seed: the deployment, the
traffic, what each handler does, the faults and the operators' actions.

A plan is plain data (JSON): the shrinker removes its parts one by one and
a shrunk plan is replayed as it is. The scheduler's own choices (every
latency, the order of what is ready) come from a second stream of the
same seed (`Plan.scheduler_seed`), so a plan and its seed replay the same
interleaving.

Handler behaviour is a function of the event and its attempt (`behaviour`),
not of the run, so an attempt that runs twice behaves the same both times.
"""

import random
from dataclasses import asdict, dataclass, field
from typing import Any

SOURCES = (
    "ext",
    "db",
    "inbox",
)  # a handler that calls the outside world, one that writes through ctx.db, a batchable one
CONCURRENCIES = (1, 4, 16, 64, 256, 256, 256)  # per worker; 256 is `run`'s default
FAULT_KINDS = (
    "kill",
    "crash",
    "stop",
    "pause",
    "pg_stall",
    "pg_down",
    "pg_flaky",
    "redis_down",
    "redis_lost",
    "redis_flush",
    "redis_expire",
    "amqp_drop",
    "amqp_alarm",
    "lag",
)
ACTION_KINDS = ("replay", "discard", "prune", "bulk_replay", "event_replay")
REPLAY_KINDS = ("replay", "bulk_replay", "event_replay")  # a drawn replay is one of these (a stream of its own)


@dataclass
class Config:
    workers: int = 2
    concurrency: int = 256
    lock_ttl: float = 3.0
    redis_masters: int = 1
    done_ttl: int = 86400
    delivery_limit: int = 20
    grace_seconds: float = 30.0
    max_attempts: int = 3
    retry_delays: tuple[float, ...] = (0.5, 2.0)


@dataclass
class Send:
    """The ingress accepting an event (or a provider's copy of it) at `at`."""

    at: float
    event: int  # which event: its key is `<source>:e<event>`
    source: str
    variant: int = 0  # another payload under the same key when not 0 (a conflict)


@dataclass
class Step:
    """A fault or an operator's action at `at` (`kind` in FAULT_KINDS or ACTION_KINDS)."""

    kind: str
    at: float
    duration: float = 0.0
    target: int = 0  # which worker or Redis master
    detail: float = 0.0  # kind-specific: a probability, a restart delay, a prune window


@dataclass
class Plan:
    seed: int
    config: Config
    sends: list[Send] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)  # faults and actions
    mix: str = "fast"  # handler durations: see `behaviour`
    failing: float = 0.0  # share of events whose handler fails some attempts
    # a scenario's own: event -> [seconds, fails] of its first attempt (later ones succeed at once)
    scripted: dict[str, list] = field(default_factory=dict)
    routed: float = 0.0  # share of events of the routed source (`fan`), drawn only on request (`draw`)

    @property
    def scheduler_seed(self) -> int:
        return self.seed * 7919 + 1

    @property
    def faults(self) -> list[Step]:
        return [step for step in self.steps if step.kind in FAULT_KINDS]

    @property
    def horizon(self) -> float:
        """When the last planned thing happens (faults end by then too)."""
        ends = [send.at for send in self.sends] + [
            step.at + (step.duration if step.kind != "crash" else 0.0) for step in self.steps
        ]
        return max(ends, default=0.0)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Plan":
        config = Config(**{**data["config"], "retry_delays": tuple(data["config"]["retry_delays"])})
        return cls(
            seed=data["seed"],
            config=config,
            sends=[Send(**s) for s in data["sends"]],
            steps=[Step(**s) for s in data["steps"]],
            mix=data["mix"],
            failing=data["failing"],
            scripted=data.get("scripted", {}),
            routed=data.get("routed", 0.0),
        )


@dataclass(frozen=True)
class Behaviour:
    seconds: float  # how long the handler takes
    fails: str | None  # None, "retry" (raises) or "permanent" (PermanentError)
    writes_first: bool  # a ctx.db handler writes before its wait, or after it


def behaviour(plan: Plan, event: int, variant: int, replay_of: int, attempt: int) -> Behaviour:
    """What the handler does for this attempt: the same every time it runs."""
    rng = random.Random(f"{plan.seed}/{event}/{variant}/{replay_of}/{attempt}")
    if str(event) in plan.scripted:
        seconds, fails = plan.scripted[str(event)] if (replay_of, attempt) == (0, 1) else (0.005, None)
        return Behaviour(seconds, fails, True)
    fails = None
    failing = random.Random(f"{plan.seed}/{event}/fails").random() < plan.failing
    if failing and replay_of == 0:  # a replay is a fixed event: it succeeds
        roll = rng.random()
        fails = "permanent" if roll < 0.1 else "retry" if roll < 0.8 else None
    return Behaviour(_duration(plan.mix, rng), fails, rng.random() < 0.5)


def _duration(mix: str, rng: random.Random) -> float:
    match mix:
        case "fast":
            return rng.uniform(0.001, 0.02)
        case "slow":  # issue 20: a downstream answering in 300 ms
            return rng.uniform(0.25, 0.35)
        case "mixed":  # 90 % take 5 ms, 10 % take 2 s
            return rng.uniform(1.5, 2.5) if rng.random() < 0.1 else rng.uniform(0.003, 0.007)
        case _:  # "tail": ms to tens of seconds
            roll = rng.random()
            return (
                rng.uniform(5, 25) if roll < 0.03 else rng.uniform(0.3, 3) if roll < 0.2 else rng.uniform(0.001, 0.05)
            )


def draw(seed: int, faults: bool | None = None, routed: float = 0.0) -> Plan:
    """A plan from `seed`; `faults` forces a run with or without faults
    (None: drawn, about a third of the runs have none); `routed`, the share
    of events sent to the routed source instead (from a stream of its own,
    so a seed draws the same plan otherwise)."""
    rng = random.Random(seed)
    config = _config(rng)
    plan = Plan(
        seed=seed,
        config=config,
        mix=rng.choice(("fast", "slow", "slow", "mixed", "tail")),
        failing=rng.choice((0.0, 0.0, 0.05, 0.2)),
    )
    plan.sends = _traffic(rng)
    if routed:
        plan.routed = routed
        fans = random.Random(f"{seed}/routed")
        chosen = {send.event for send in plan.sends if fans.random() < routed}
        plan.sends = [
            Send(send.at, send.event, "fan", send.variant) if send.event in chosen else send for send in plan.sends
        ]
    with_faults = rng.random() > 0.35 if faults is None else faults
    if with_faults:
        span = max(plan.horizon, 5.0)
        plan.steps = [_fault(rng, config, span) for _ in range(rng.randint(1, 6))]
        plan.steps += [_action(rng, span) for _ in range(rng.choice((0, 0, 1, 3)))]
        plan.steps.sort(key=lambda step: step.at)
        replays = random.Random(f"{seed}/replays")
        for step in plan.steps:
            if step.kind == "replay":
                step.kind = replays.choice(REPLAY_KINDS)
    return plan


def _config(rng: random.Random) -> Config:
    delays = rng.choice(((0.5, 2.0), (1.0,), (0.2, 0.5, 5.0), (8.0,)))
    return Config(
        workers=rng.choice((1, 2, 2, 3)),
        concurrency=rng.choice(CONCURRENCIES),
        lock_ttl=rng.choice((3.0, 3.0, 3.0, 1.0, 5.0)),
        redis_masters=rng.choice((1, 1, 3)),
        done_ttl=rng.choice((86400, 86400, 5)),
        grace_seconds=rng.choice((30.0, 30.0, 7.0, 2.0)),
        max_attempts=rng.choice((3, 3, 2, 5)),
        retry_delays=delays,
    )


def _traffic(rng: random.Random) -> list[Send]:
    events = rng.choice((5, 20, 60, 150, 300))
    spread = rng.choice((0.0, 0.0, 2.0, 10.0, 30.0))  # 0: a backlog, all queued at once
    sends = []
    for event in range(events):
        source = rng.choice(SOURCES)
        at = rng.uniform(0, spread)
        sends.append(Send(round(at, 4), event, source))
        while rng.random() < 0.15:  # the provider sends it again, at any time
            variant = 1 if rng.random() < 0.2 else 0
            sends.append(Send(round(at + rng.expovariate(1 / rng.choice((0.01, 0.5, 5.0))), 4), event, source, variant))
    return sorted(sends, key=lambda send: send.at)


def _fault(rng: random.Random, config: Config, span: float) -> Step:
    kind = rng.choice(FAULT_KINDS)
    at = round(rng.uniform(0, span), 4)
    duration = round(rng.choice((0.2, 1.0, 4.0, 10.0)) * rng.random(), 4)
    target = rng.randrange(config.redis_masters if kind.startswith("redis") else config.workers)
    if kind == "crash":  # at the Nth await point: the duration counts points, not seconds
        duration = float(rng.randint(1, 400))
    if kind == "pause":  # mostly within the lease's margin (a third of it), sometimes past it
        duration = round(config.lock_ttl * (rng.uniform(0.02, 0.3) if rng.random() < 0.8 else rng.uniform(0.4, 1.5)), 4)
    detail = {
        "kill": rng.choice((0.5, 5.0)),
        "crash": rng.choice((0.5, 5.0)),
        "stop": rng.choice((0.5, 5.0)),
        "pg_flaky": rng.choice((0.05, 0.3)),
        "pg_stall": rng.choice((-1, target)),
        "lag": rng.choice((0.002, 0.01, 0.03)),
    }.get(kind, 0.0)  # -1: every worker
    return Step(kind, at, duration, target, detail)


def _action(rng: random.Random, span: float) -> Step:
    kind = rng.choice(ACTION_KINDS[:3])
    return Step(kind, round(rng.uniform(0, span * 2), 4), 0.0, 0, rng.choice((0.0, 5.0)))
