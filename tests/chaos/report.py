"""The one-screen report of a run."""

from collections import Counter

from tests.chaos.checks import Verdict
from tests.chaos.plan import Plan
from tests.chaos.traffic import Sent

SHOWN_PER_KIND = 5


def render(
    plan: Plan, sent: Sent, verdict: Verdict, target: str, drained: str, log_dir: str, more: list[str] | None = None
) -> str:
    """`more`: lines on re-runs and replays (tests/chaos/reruns.py, replays.py), after the outcomes."""
    kinds = Counter(event.kind for event in plan.events)
    fails = Counter(event.fail for event in plan.events if event.fail)
    faults = Counter(fault.action if fault.action != "cut" else f"cut {fault.service}" for fault in plan.faults)
    lines = [
        f"chaos run  seed={plan.seed}  target={target}",
        (
            f"sent       {len(plan.events)} events, {len(plan.requests)} requests over {plan.duration:.0f}s;"
            f" kinds: {_counts(kinds)}; told to fail: {_counts(fails) or 'none'}"
        ),
        f"answers    {_counts(sent.statuses)}",
        f"faults     {len(plan.faults)}: {_counts(faults) or 'none'}",
        f"drain      {drained}",
        f"outcomes   {_counts(verdict.outcomes)}",
        *(more or []),
    ]
    lines += _violations(verdict)
    lines.append(
        f"logs       {log_dir} (each process's log, faults.txt: when each fault was applied)" if log_dir else ""
    )
    replayed = "events, copies and fault schedule" if plan.faults else "events and copies"
    lines.append(f"reproduce  --seed {plan.seed} (same {replayed}; the machine's timing varies)")
    return "\n".join(line for line in lines if line)


def _violations(verdict: Verdict) -> list[str]:
    if not verdict.violations:
        return ["verdict    OK: no violation"]
    by_kind: dict[str, list[str]] = {}
    for kind, detail in verdict.violations:
        by_kind.setdefault(kind, []).append(detail)
    lines = [f"verdict    FAIL: {len(verdict.violations)} violation(s)"]
    for kind, details in sorted(by_kind.items(), key=lambda item: -len(item[1])):
        lines.append(f"  {kind}: {len(details)}")
        lines += [f"    {detail}" for detail in details[:SHOWN_PER_KIND]]
        if len(details) > SHOWN_PER_KIND:
            lines.append(f"    … and {len(details) - SHOWN_PER_KIND} more")
    return lines


def _counts(counter) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(counter.items(), key=lambda item: -item[1]) if count)
