"""A failing plan made small: delta debugging (Zeller's ddmin) over its
parts — each send (an event or a copy) and each fault or action — then
fewer workers. A smaller plan counts when it still fails the same way (a
violation of the same kind); the scheduler's seed stays, so what is left
is a plan that replays its failure as it is (`python -m tests.sim --replay`).

A run is cheap (tens of milliseconds for a few events), so the budget is
in runs, not in time.
"""

import copy
from collections.abc import Callable

from tests.sim.plan import Plan
from tests.sim.simulation import Result, Simulation


def shrink(
    plan: Plan,
    kind: str,
    strict_attempts: bool = False,
    budget: int = 300,
    progress: Callable[[str], None] = lambda _: None,
) -> tuple[Plan, Result]:
    """The smallest plan found that still has a violation of `kind`, with its run."""
    runs = 0
    best: list = [plan, None]

    def fails(candidate: Plan) -> bool:
        nonlocal runs
        if runs >= budget:
            return False
        runs += 1
        result = Simulation(candidate, strict_attempts).run()
        if any(v.kind == kind and not v.known for v in result.violations):
            best[:] = [candidate, result]
            return True
        return False

    if not fails(plan):
        raise ValueError(f"the plan does not fail with {kind!r}")
    parts = [("send", send) for send in plan.sends] + [("step", step) for step in plan.steps]
    kept = _ddmin(parts, lambda subset: fails(_with(plan, subset)))
    progress(f"{len(parts)} parts -> {len(kept)} in {runs} runs")
    smaller = _with(plan, kept)
    while smaller.config.workers > 1 and runs < budget:
        fewer = copy.deepcopy(smaller)
        fewer.config.workers -= 1
        fewer.steps = [
            step for step in fewer.steps if step.target < fewer.config.workers or step.kind.startswith("redis")
        ]
        if not fails(fewer):
            break
        smaller = fewer
    progress(f"{smaller.config.workers} workers; {runs} runs in all")
    return best[0], best[1]


def _with(plan: Plan, parts: list) -> Plan:
    smaller = copy.deepcopy(plan)
    smaller.sends = [copy.deepcopy(part) for kind, part in parts if kind == "send"]
    smaller.steps = [copy.deepcopy(part) for kind, part in parts if kind == "step"]
    return smaller


def _ddmin(parts: list, fails: Callable[[list], bool]) -> list:
    chunks = 2
    while len(parts) >= 2:
        size = -(-len(parts) // chunks)
        pieces = [parts[i : i + size] for i in range(0, len(parts), size)]
        for piece in pieces:
            if fails(piece):
                parts, chunks = piece, 2
                break
        else:
            for piece in pieces:
                rest = [part for part in parts if not any(part is p for p in piece)]
                if fails(rest):
                    parts, chunks = rest, max(chunks - 1, 2)
                    break
            else:
                if chunks >= len(parts):
                    return parts
                chunks = min(len(parts), chunks * 2)
    return parts
