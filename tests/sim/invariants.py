"""What must hold at every step of a run (issue 26, item 3), checked as it happens.

- **No accepted event lost**: when the broker lets go of the last message
  that carries an event (key and payload), the event is settled — its
  key completed with that payload, or its payload recorded as a conflict,
  or an open dead letter, or discarded by an operator. At the end, every
  accepted event is settled and nothing waits (`Simulation.finish`).
- **Effects once**: a key's committed `ctx.db` effects number at most one
  per epoch (an epoch ends when `prune` or a discard forgets the key, after
  which a copy runs again by design).
- **Never two runs of one key at once**: a handler run starts while no
  other run of its key is in progress (a killed process's runs end with it).
  Known, and so not failing a run: the other run's process was paused past
  the lease's margin (docs/design.md, "Exclusion", names this limit).
- **One run per attempt**: an attempt (key, payload, chain, attempt) runs
  at most once per epoch — checked in runs without faults, where it must
  hold; with faults only on request (`strict_attempts`), since attempts
  are at least once by design (docs/design.md, "One next attempt per
  failed attempt": findings B4 and B6). A batchable handler may run twice:
  once in a batch that rolled back (another event's failure, a refused
  completion) and once alone, by design (`workers/claim/batch.py`).
- **A run repeated only for a reason** (issue 35, item 5): once a
  handler ran for a key without failing on its own (it returned, or was
  cancelled or rolled back by the worker: its call to the outside world
  went out all the same; not one refused its transaction before that
  call), another run of that key in the same epoch is a
  violation ("repeat") unless another worker took the key's lease in
  Postgres meanwhile, the first run's process exited (a kill, a crash, a
  stop's grace that ended), Postgres was away from it meanwhile (a stall,
  down or failing: a lease it cannot confirm in time is given up, by
  design), or, for a batchable handler, the first run's batch rolled back
  (it then runs alone, by design: `workers/claim/batch.py`). A pause or a
  loaded loop is never a reason: the lease in Postgres decides, and no one
  else took it (docs/design.md, "A lock that cannot be kept").
- **Every message acked exactly once**: the broker refuses an ack for a
  delivery it does not hold (a second ack, or a `multiple` ack that
  covered a delivery still being worked on), as RabbitMQ does by closing
  the channel.
"""

from collections import Counter, defaultdict
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Violation:
    kind: str
    key: str
    detail: str
    at: float
    known: str = ""  # a finding already on record (`tests.sim.known`), which a run reports but does not fail on


@dataclass(eq=False)
class Run:
    process: str
    attempt: tuple
    started: float
    failed: bool = False  # the handler failed on its own (it raised): a next attempt is by design
    rolled_back: bool = False  # its transaction rolled back (set by the simulated server)
    did_nothing: bool = False  # ended before its call to the outside world, its write not committed
    ended: float | None = None


@dataclass
class Ledger:
    strict_attempts: bool
    faulty: bool  # the plan injects faults
    accepted: set[tuple[str, str]] = field(default_factory=set)
    discarded: set[tuple[str, str]] = field(default_factory=set)
    ever_completed: set[tuple[str, str]] = field(default_factory=set)  # kept across prune
    epochs: Counter = field(default_factory=Counter)
    active: dict[str, list[Run]] = field(default_factory=lambda: defaultdict(list))
    runs: Counter = field(default_factory=Counter)
    effects_per_epoch: Counter = field(default_factory=Counter)
    ran: dict[str, list[Run]] = field(default_factory=lambda: defaultdict(list))  # this epoch's runs of a key
    # why a run of a key may repeat `earlier` now ("" if nothing excuses it): the simulation's
    excuse: object = None
    violations: list[Violation] = field(default_factory=list)

    def violate(self, kind: str, key: str, detail: str, at: float, known: str = "") -> None:
        self.violations.append(Violation(kind, key, detail, at, known))

    # -- handler runs ----------------------------------------------------------

    def run_started(
        self,
        process: str,
        key: str,
        attempt: tuple,
        at: float,
        allowed: int = 1,
        known: str = "",
        known_overlap=lambda other: "",
    ) -> Run:
        for other in self.active[key]:
            self.violate(
                "overlap",
                key,
                f"{process} starts {attempt} while {other.process} runs {other.attempt} (since {other.started:.3f})",
                at,
                known_overlap(other),
            )
        self._check_repeat(process, key, attempt, at, known)
        run = Run(process, attempt, at)
        self.active[key].append(run)
        self.ran[key].append(run)
        counted = (key, *attempt, self.epochs[key])
        self.runs[counted] += 1
        if self.runs[counted] > allowed and (self.strict_attempts or not self.faulty):
            why = "with faults (strict)" if self.faulty else "with no fault injected"
            self.violate(
                "rerun",
                key,
                f"attempt {attempt} runs for the {self.runs[counted]}th time {why}, on {process}",
                at,
                known,
            )
        return run

    def _check_repeat(self, process: str, key: str, attempt: tuple, at: float, known: str) -> None:
        earlier = next((run for run in reversed(self.ran[key]) if not (run.failed or run.did_nothing)), None)
        if earlier is None or self.excuse is None:
            return
        why = self.excuse(key, earlier, at)  # type: ignore[operator]
        if not why:
            self.violate(
                "repeat",
                key,
                f"{process} runs {attempt} again after {earlier.process} ran "
                f"{earlier.attempt} (since {earlier.started:.3f}) without failing, and no "
                "other worker took the key, nor did its process exit or lose Postgres",
                at,
                known,
            )

    def run_ended(self, key: str, run: Run, at: float | None = None) -> None:
        run.ended = at
        if run in self.active[key]:
            self.active[key].remove(run)

    def process_died(self, process: str) -> None:
        for runs in self.active.values():
            runs[:] = [run for run in runs if run.process != process]

    # -- effects and settlement ------------------------------------------------

    def effects_committed(self, key: str, count: int, at: float) -> None:
        if count > 1:
            self.violate("effect-twice", key, f"{count} effects committed in epoch {self.epochs[key]}", at)

    def forgotten(self, key: str) -> None:
        """prune or a discard forgot the key: a copy may run again (a new epoch)."""
        self.epochs[key] += 1
        self.ran.pop(key, None)

    def check_settled(self, key: str, sha: str, carriers: int, settled: bool, at: float, why: str) -> None:
        if (key, sha) in self.accepted and carriers == 0 and not settled:
            self.violate(
                "lost",
                key,
                f"{why}: no message carries payload {sha[:8]} any more, and it is neither "
                "completed, a conflict, a dead letter nor discarded",
                at,
            )
