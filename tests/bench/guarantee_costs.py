"""What each guarantee costs per event (issue 39), measured on the contract
floor (tests/bench/contract_floor.py): the floor alone, then the floor with
one guarantee added as plainly as it can be written (`claim`, `lease`,
`turn`, `done`, `metrics`), and without its archive rows (`no_archive`);
`python -m tests.bench --phase guarantee_costs`, only alone.

Each variant is its own floor (database, queue, processes), EVENTS events
after the floor's warm-up; ROUNDS rounds, each in the opposite order of the
one before (a drift of the host cancels). A guarantee's cost is the median
over the rounds of its variant's CPU per event less the floor's in the same
round (the archive's: the floor's less `no_archive`'s), every process but
the broker, whose work no variant changes and which other users of a shared
host move most: what the guarantee costs where nothing else of ours is, a
lower bound of its price in ours."""

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
    runs: dict[str, list[float]] = {variant: [] for variant in VARIANTS}  # CPU ms an event, the broker's aside
    rates: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for round_number in range(ROUNDS):
        for variant in VARIANTS if round_number % 2 == 0 else reversed(VARIANTS):
            found: dict[str, float] = {}
            await contract_floor.measure(found, frozenset([variant]) if variant else frozenset(), EVENTS)
            name = _name(variant)
            runs[variant].append(found[f"{name}_cpu_ms"] - found[f"{name}_cpu_ms_beam"])
            rates[variant].append(found[f"{name}_events_per_s"])
            for key in ("lost", "duplicated_effects"):
                figures[key] = figures.get(key, 0) + found.get(key, 0)
    for variant in VARIANTS:
        name = _name(variant)
        figures[f"{name}_cpu_ms_but_broker"] = statistics.median(runs[variant])
        figures[f"{name}_events_per_s"] = statistics.median(rates[variant])
    for variant in VARIANTS[1:]:
        sign = -1 if variant == "no_archive" else 1
        figures[f"cost_{variant.removeprefix('no_')}_ms"] = statistics.median(
            sign * (added - floor) for added, floor in zip(runs[variant], runs[""])
        )


ROWS = [
    ("contract_floor_cpu_ms_but_broker", "contract floor: CPU ms an event, every process but the broker", "{:.3f}"),
    *((f"cost_{v.removeprefix('no_')}_ms", f"{LABELS[v]}: CPU ms an event", "{:+.3f}") for v in VARIANTS[1:]),
]
