"""What each guarantee costs per event (issue 39), measured on the contract
floor (tests/bench/contract_floor.py): the floor alone, then the floor with
one guarantee added as plainly as it can be written (`claim`, `lease`,
`turn`, `done`, `metrics`), and without its archive rows (`no_archive`);
`python -m tests.bench --phase guarantee_costs`, only alone.

Each run is a floor of its own (database, queue, processes), EVENTS events
after the floor's warm-up. Each variant runs beside a floor run of its own,
the pair in one order, then in the other the next round (a drift of the host
cancels), ROUNDS rounds. A guarantee's cost is the median over the rounds of
its variant's CPU per event less its floor run's (the archive's: the floor's
less `no_archive`'s), every process but the broker, whose work no variant
changes and which other users of a shared host move most: what the guarantee
costs where nothing else of ours is, a lower bound of its price in ours."""

import os
import statistics

from tests.bench import contract_floor

EVENTS = int(os.environ.get("BENCH_COSTS_EVENTS", "6000"))
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
    floors: dict[str, list[float]] = {variant: [] for variant in VARIANTS[1:]}  # the floor run beside each
    runs: dict[str, list[float]] = {variant: [] for variant in VARIANTS}  # CPU ms an event, the broker's aside
    rates: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    for round_number in range(ROUNDS):
        for variant in VARIANTS[1:]:
            pair = ["", variant] if round_number % 2 == 0 else [variant, ""]
            for run in pair:
                cpu, rate = await _run(run, figures)
                runs[run].append(cpu)
                rates[run].append(rate)
                if not run:
                    floors[variant].append(cpu)
    for variant in VARIANTS:
        name = _name(variant)
        figures[f"{name}_cpu_ms_but_broker"] = statistics.median(runs[variant])
        figures[f"{name}_events_per_s"] = statistics.median(rates[variant])
    for variant in VARIANTS[1:]:
        sign = -1 if variant == "no_archive" else 1
        figures[f"cost_{variant.removeprefix('no_')}_ms"] = statistics.median(
            sign * (added - floor) for added, floor in zip(runs[variant], floors[variant])
        )


async def _run(variant: str, figures: dict) -> tuple[float, float]:
    """One floor of the variant: its CPU ms an event but the broker's, its events/s."""
    found: dict[str, float] = {}
    await contract_floor.measure(found, frozenset([variant]) if variant else frozenset(), EVENTS)
    for key in ("lost", "duplicated_effects"):
        figures[key] = figures.get(key, 0) + found.get(key, 0)
    name = _name(variant)
    return found[f"{name}_cpu_ms"] - found[f"{name}_cpu_ms_beam"], found[f"{name}_events_per_s"]


ROWS = [
    ("contract_floor_cpu_ms_but_broker", "contract floor: CPU ms an event, every process but the broker", "{:.3f}"),
    *((f"cost_{v.removeprefix('no_')}_ms", f"{LABELS[v]}: CPU ms an event", "{:+.3f}") for v in VARIANTS[1:]),
]
