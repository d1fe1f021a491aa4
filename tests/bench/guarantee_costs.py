"""What each guarantee costs per event (issue 39), measured on the contract
floor (tests/bench/contract_floor.py): the floor alone, then the floor with
one guarantee added as plainly as it can be written (`claim`, `lease`,
`turn`, `done`, `metrics`), and without its archive rows (`no_archive`);
`python -m tests.bench --phase guarantee_costs`, only alone.

Each variant is its own floor (database, queue, processes), EVENTS events
after the floor's warm-up; ROUNDS rounds, each in the opposite order of the
one before (a drift of the host cancels). A guarantee's cost is its
variant's median CPU per event over every process less the floor's median
(the archive's: the floor's less `no_archive`'s), so what it costs where
nothing else of ours is: a lower bound of its price in ours."""

import os
import statistics

from tests.bench import contract_floor

EVENTS = int(os.environ.get("BENCH_COSTS_EVENTS", "10000"))
ROUNDS = int(os.environ.get("BENCH_COSTS_ROUNDS", "2"))
VARIANTS = ["", "claim", "lease", "turn", "done", "metrics", "no_archive"]
LABELS = {
    "claim": "Redis claim (lock per key, SET NX PX, compare-and-delete)",
    "lease": "lease + check + fence (our statements, own commits)",
    "turn": "turn (advisory lock per key in the transaction)",
    "done": "done marker (SET after commit; ingress GET per request)",
    "metrics": "metrics (a counter and a histogram, ingress and consumer)",
    "no_archive": "archive (its rows in the floor's transaction)",
}


def _name(variant: str) -> str:
    return "contract_floor" + (f"_{variant}" if variant else "")


async def measure(figures: dict) -> None:
    runs: dict[str, list[tuple[float, float]]] = {variant: [] for variant in VARIANTS}
    for round_number in range(ROUNDS):
        for variant in VARIANTS if round_number % 2 == 0 else reversed(VARIANTS):
            found: dict[str, float] = {}
            await contract_floor.measure(found, frozenset([variant]) if variant else frozenset(), EVENTS)
            name = _name(variant)
            runs[variant].append((found[f"{name}_cpu_ms"], found[f"{name}_events_per_s"]))
            for key in ("lost", "duplicated_effects"):
                figures[key] = figures.get(key, 0) + found.get(key, 0)
    for variant, results in runs.items():
        name = _name(variant)
        figures[f"{name}_cpu_ms"] = statistics.median(cpu for cpu, _ in results)
        figures[f"{name}_events_per_s"] = statistics.median(rate for _, rate in results)
    floor = figures["contract_floor_cpu_ms"]
    for variant in VARIANTS[1:]:
        added = figures[f"{_name(variant)}_cpu_ms"]
        figures[f"cost_{variant.removeprefix('no_')}_ms"] = floor - added if variant == "no_archive" else added - floor


ROWS = [(f"cost_{v.removeprefix('no_')}_ms", f"{LABELS[v]}: CPU ms an event", "{:+.3f}") for v in VARIANTS[1:]]
