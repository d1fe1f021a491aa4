"""The plan's faults, applied at their time, and which are on now.

Windows in virtual time that the fakes consult on every call: Postgres
stalled for one process (a partition, a stalled VM's network) or for all,
Postgres down, Postgres failing some statements; a Redis master down
(timing out or refusing), losing its data, every master flushed, one key
forgotten; a process's broker connection dropping (its channels reopen
after a while) or a memory alarm blocking every publish; a process killed
(SIGKILL: its tasks cancelled, its calls raising `Killed`) or stopped
(SIGTERM: `Worker.stop()`, the grace period, then the exit), each
restarted after a while; a `crash` is a kill at the process's Nth await
point after the step's time (`tests.sim.network`), any point as likely as
another; a process paused (a GC pause, a stopped VM) for a while, its
callbacks frozen while the world goes on; a process's loop lagging (a
loaded host, a CPU-throttled container): each of its steps costs it some
virtual time, so its timers fire late.
"""

from dataclasses import dataclass, field

from tests.sim.plan import Step


@dataclass
class Faults:
    sim: object
    pg_stalls: dict[int, float] = field(default_factory=dict)  # slot (-1: every one) -> until
    pg_down_until: float = 0.0
    pg_flaky_until: float = 0.0
    pg_flaky_share: float = 0.0
    pg_windows: list[tuple[int, float, float]] = field(default_factory=list)  # slot (-1: every one), from, until

    def pg_away(self, slot: int, start: float, end: float) -> bool:
        """Whether Postgres was stalled, down or failing for `slot` at some time in [start, end]."""
        return any(target in (-1, slot) and since <= end and until >= start for target, since, until in self.pg_windows)

    def _now(self) -> float:
        return self.sim.loop.time()  # type: ignore[attr-defined]

    def pg_stalled_until(self, slot: int | None) -> float | None:
        now = self._now()
        until = max(self.pg_stalls.get(-1, 0.0), self.pg_stalls.get(slot, 0.0) if slot is not None else 0.0)
        return until if until > now else None

    def pg_fails(self) -> bool:
        now = self._now()
        if now < self.pg_down_until:
            return True
        return now < self.pg_flaky_until and self.sim.rng.random() < self.pg_flaky_share / 2  # type: ignore[attr-defined]


def apply(sim, step: Step) -> None:
    """Starts the fault `step` now."""
    for kinds, start in _STARTS:
        if step.kind in kinds:
            return start(sim, step, sim.loop.time())
    raise ValueError(step.kind)


def _process_fault(sim, step: Step, now: float) -> None:
    """A fault of one worker process: killed, crashed at an await point, stopped, paused, lagging, broker dropped."""
    if step.kind == "kill":
        sim.kill(step.target, restart_after=step.detail)
        return
    if step.kind == "stop":
        sim.stop(step.target, restart_after=step.detail)
        return
    process = sim.in_slot(step.target)
    if process is None:
        return
    match step.kind:
        case "crash":  # killed at its Nth await point from now
            sim.net.arm(
                process.name, max(int(step.duration), 1), lambda: sim.kill(step.target, restart_after=step.detail)
            )
        case "pause":
            sim.pause(process, step.duration)
        case "lag":  # a loaded host: each step of the process costs it `detail` seconds
            sim.note("sim", "lagging", None, f"{process.name} for {step.duration}s, {step.detail}s a step")
            sim.loop.lag(process.name, now + step.duration, step.detail)
            sim.lags.append((process.name, now + step.duration))
        case "amqp_drop":
            process.connection.drop(max(step.duration, 0.05))


def _postgres_fault(sim, step: Step, now: float) -> None:
    """Postgres stalled for one process or all, down, or failing some statements."""
    faults = sim.faults
    match step.kind:
        case "pg_stall":
            target = int(step.detail)
            faults.pg_stalls[target] = max(faults.pg_stalls.get(target, 0.0), now + step.duration)
            faults.pg_windows.append((target, now, now + step.duration))
            return
        case "pg_down":
            faults.pg_down_until = max(faults.pg_down_until, now + step.duration)
        case "pg_flaky":
            faults.pg_flaky_until, faults.pg_flaky_share = now + step.duration, step.detail
    faults.pg_windows.append((-1, now, now + step.duration))


def _redis_fault(sim, step: Step, now: float) -> None:
    """A Redis master down, one losing its data, every master flushed, one key forgotten."""
    match step.kind:
        case "redis_down":
            master = sim.masters[step.target]
            master.down_until, master.refuses = now + step.duration, sim.rng.random() < 0.5
        case "redis_lost":
            sim.masters[step.target].data.clear()
        case "redis_flush":
            for master in sim.masters:
                master.data.clear()
        case "redis_expire":
            held = sorted({key for master in sim.masters for key in master.data})
            if held:
                forgotten = sim.rng.choice(held)
                for master in sim.masters:
                    master.data.pop(forgotten, None)


def _broker_alarm(sim, step: Step, now: float) -> None:
    sim.broker.alarm_until = max(sim.broker.alarm_until, now + step.duration)


_STARTS = (
    (("kill", "crash", "stop", "pause", "lag", "amqp_drop"), _process_fault),
    (("pg_stall", "pg_down", "pg_flaky"), _postgres_fault),
    (("redis_down", "redis_lost", "redis_flush", "redis_expire"), _redis_fault),
    (("amqp_alarm",), _broker_alarm),
)
