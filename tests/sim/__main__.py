"""`make simulate SEED=… STEPS=…`: run seeds from SEED until STEPS loop
steps are spent; on the first failure, shrink it, print its seed, its
violations and the trace of the keys involved, and write the shrunk plan
to replay (`--replay`).

    python -m tests.sim --seed 1 --steps 1000000
    python -m tests.sim --seed 125 --seeds 1 --faults no      # one seed again
    python -m tests.sim --replay build/sim/seed-125.json      # a shrunk plan
    python -m tests.sim --scenario b4 --strict-attempts       # a known finding
"""

import argparse
import json
import pathlib
import sys
import time
from collections import Counter

from tests.sim.plan import Plan, draw
from tests.sim.report import describe, plan_json
from tests.sim.scenarios import SCENARIOS
from tests.sim.shrink import shrink
from tests.sim.simulation import Result, Simulation

OUT = pathlib.Path("build/sim")
SEVERITY = (
    "lost",
    "effect-twice",
    "overlap",
    "repeat",
    "deadlock",
    "ack-unknown-tag",
    "crash",
    "stuck",
    "livelock",
    "rerun",
)


def main(argv: list[str] | None = None) -> int:
    options = _parser().parse_args(argv)
    faults = {"yes": True, "no": False, "drawn": None}[options.faults]
    if options.replay or options.scenario:
        plan = (
            Plan.from_json(json.loads(pathlib.Path(options.replay).read_text()))
            if options.replay
            else SCENARIOS[options.scenario]()
        )
        result = Simulation(plan, options.strict_attempts).run()
        print(describe(result, limit=options.trace_lines))
        return 1 if result.failed else 0
    seeds = steps = 0
    known: Counter = Counter()
    started = time.perf_counter()
    seed = options.seed
    while steps < options.steps and (options.seeds is None or seeds < options.seeds):
        result = Simulation(draw(seed, faults, options.routes), options.strict_attempts).run()
        seeds, steps = seeds + 1, steps + result.steps
        if result.failed:
            return _failed(result, options)
        known.update({v.known for v in result.violations})
        if options.verbose:
            print(f"seed {seed}: ok, {result.steps} steps, {result.stats}", flush=True)
        seed += 1
    elapsed = time.perf_counter() - started
    print(
        f"{seeds} seeds ({options.seed}..{seed - 1}), {steps} steps in {elapsed:.1f} s "
        f"({steps / elapsed:,.0f} steps/s): no new violation"
        f"{f'; seeds with known findings: {dict(known)}' if known else ''}"
    )
    return 0


def _failed(result: Result, options) -> int:
    print(describe(result, limit=options.trace_lines))
    if not options.no_shrink:
        kind = min((v for v in result.violations if not v.known), key=lambda v: SEVERITY.index(v.kind)).kind
        print(f"\nshrinking (violations of kind {kind!r}) …", flush=True)
        _plan, result = shrink(result.plan, kind, options.strict_attempts, progress=lambda line: print("  " + line))
        print(describe(result, limit=options.trace_lines))
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"seed-{result.plan.seed}.json"
    path.write_text(plan_json(result))
    print(
        f"\nseed {result.plan.seed} fails; replay with: python -m tests.sim --replay {path}"
        f"{' --strict-attempts' if options.strict_attempts else ''}"
    )
    return 1


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tests.sim", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=1, help="the first seed (default 1)")
    parser.add_argument("--steps", type=int, default=1_000_000, help="loop steps to spend in all (default 1e6)")
    parser.add_argument("--seeds", type=int, help="at most this many seeds")
    parser.add_argument(
        "--faults",
        choices=("yes", "no", "drawn"),
        default="drawn",
        help="runs with faults, without, or either as the seed draws (default)",
    )
    parser.add_argument(
        "--strict-attempts",
        action="store_true",
        help="also with faults, each attempt runs at most once (attempts are at least once by "
        "design: findings B4 and B6)",
    )
    parser.add_argument(
        "--routes",
        type=float,
        default=0.0,
        metavar="SHARE",
        help="this share of events goes to a source with two routes (default 0)",
    )
    parser.add_argument("--replay", help="run the plan in this JSON file (a shrunk failure)")
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), help="run a hand-written plan")
    parser.add_argument("--no-shrink", action="store_true", help="print the failure as it is")
    parser.add_argument("--trace-lines", type=int, default=200, help="trace entries to print (default 200)")
    parser.add_argument("--verbose", "-v", action="store_true", help="one line per seed")
    return parser


if __name__ == "__main__":
    sys.exit(main())
