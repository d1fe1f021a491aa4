"""A failure as a reader needs it: the seed, the violations, the plan that
is left, and the trace of the keys involved — every call, log line,
handler run and broker move that names them, with the run's faults and
process starts and exits around them.
"""

import hashlib
import json

from tests.sim.simulation import Result

_ALWAYS = ("sim", "plan", "operator")


def trace_digest(result: Result) -> str:
    """One hash of the whole trace: equal for equal runs."""
    return hashlib.sha256(repr(result.trace).encode()).hexdigest()[:16]


def describe(result: Result, limit: int = 200) -> str:
    plan = result.plan
    lines = [
        f"seed {plan.seed}: {len(result.violations)} violation(s) in {result.steps} steps "
        f"({result.virtual_seconds:.1f} virtual s, {result.wall_seconds:.2f} s)",
        f"  config {plan.config}",
        f"  mix {plan.mix}, failing {plan.failing}, "
        f"{len(plan.sends)} sends, steps {[(s.kind, s.at, s.duration, s.target) for s in plan.steps]}",
    ]
    lines += [
        f"  VIOLATION {v.kind} {v.key} at {v.at:.6f}: {v.detail}{f' (known: {v.known})' if v.known else ''}"
        for v in result.violations[:10]
    ]
    new = [v for v in result.violations if not v.known] or result.violations
    keys = {v.key for v in new[:3] if v.key}
    shown = [entry for entry in result.trace if entry[4] in keys or (entry[2] in _ALWAYS)]
    lines.append(f"  trace of {sorted(keys) or 'the run'} ({len(shown)} of {len(result.trace)} entries):")
    for at, process, service, what, key, detail in shown[:limit]:
        lines.append(f"    {at:12.6f} {process:>6} {service:<8} {what:<30} {key:<12} {detail}")
    if len(shown) > limit:
        lines.append(f"    … {len(shown) - limit} more")
    return "\n".join(lines)


def plan_json(result: Result) -> str:
    return json.dumps(result.plan.to_json(), indent=1)
