"""The local deployment with every fault kind, and a record of each fault
as it was applied: which worker process it hit (its pid then), from when
to when (wall clock, to set beside the tables and the downstream's calls).
The checks read the record to tell a re-run some fault explains from one
nothing does (tests/chaos/reruns.py).

Beside the deployment's own kills, cuts, flushes and prunes: SIGSTOP
pauses and a CPU hog (tests/chaos/pauses.py), an event replay by window
and a dead-letter bulk replay through the CLI (tests/chaos/replays.py).
"""

import time
from dataclasses import dataclass

from tests.chaos import pauses, replays
from tests.chaos.deployment import SOURCE, LocalDeployment
from tests.chaos.plan import Fault
from tests.support.processes import ROOT


@dataclass(frozen=True)
class Applied:
    action: str
    started: float  # wall clock
    ended: float
    worker: int = -1
    pid: int = 0  # the worker's process when the fault began
    service: str = ""

    def touches(self, pid: int, since: float, until: float) -> bool:
        """Hit process `pid` at some moment between `since` and `until`."""
        return self.pid == pid and self.started <= until and self.ended >= since


class FullDeployment(LocalDeployment):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.applied: list[Applied] = []
        self.issued: list[replays.IssuedReplay] = []
        self.stopped: set[int] = set()  # pids under a pause now

    async def _apply(self, fault: Fault) -> None:
        started = time.time()
        slot = self.slots[fault.worker] if fault.worker >= 0 else None
        pid = slot.process.pid if slot is not None and slot.process is not None else 0
        if fault.action == "pause" and pid in self.stopped:
            return  # stopped already: the pause under way decides when it is continued
        try:
            match fault.action:
                case "pause":
                    self.stopped.add(pid)
                    try:
                        await pauses.paused(pid, fault.seconds)
                    finally:
                        self.stopped.discard(pid)
                case "hog":
                    await pauses.cpu_hog(fault.seconds)
                case "replay":
                    self.issued.append(await replays.events_replay(self._cli_env(), SOURCE, fault.seconds))
                case "dlq-replay":
                    self.issued.append(await replays.dead_letter_replay(self._cli_env(), SOURCE))
                case _:
                    await super()._apply(fault)
        finally:
            ended = started if fault.action == "kill" else time.time()  # a kill is a moment; the rest last
            self.applied.append(Applied(fault.action, started, ended, fault.worker, pid, fault.service))

    def _cli_env(self) -> dict[str, str]:
        return {**self.fleet.env, "PYTHONPATH": str(ROOT)}
