"""The handlers the simulated workers run (sources `ext`, `db` and `inbox`).

`external` stands for a handler like `forward`: it waits on the outside
world and never touches `ctx.db`. `transactional` writes a row through
`ctx.db` and waits too. `inbox` does the same and is batchable, so it
takes the batch path (`workers/claim/batch.py`). How long each takes and whether
it fails is the plan's (`tests.sim.plan.behaviour`); the simulation
records every run (`Simulation.handle`).
"""

SIMULATION = None  # the running Simulation (set by tests.sim.patches)


async def external(event, ctx) -> None:
    await SIMULATION.handle(event, ctx, writes=False)  # type: ignore[attr-defined]


async def transactional(event, ctx) -> None:
    await SIMULATION.handle(event, ctx, writes=True)  # type: ignore[attr-defined]


async def inbox(event, ctx) -> None:
    await SIMULATION.handle(event, ctx, writes=True)  # type: ignore[attr-defined]


inbox.batchable = True  # type: ignore[attr-defined]

HANDLERS = {
    "ext": "tests.sim.handlers:external",
    "db": "tests.sim.handlers:transactional",
    "inbox": "tests.sim.handlers:inbox",
}
