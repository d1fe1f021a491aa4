"""The bench's handler: one INSERT through the completion transaction, like
the built-in `inbox`, into a table without a unique key, so a second run of
an event would show as a second row (`duplicated_effects`) instead of a
failed insert."""

EFFECTS_TABLE = "CREATE TABLE bench_effects (key text NOT NULL, payload jsonb NOT NULL)"


async def record(event, ctx) -> None:
    await ctx.db.execute("INSERT INTO bench_effects (key, payload) VALUES ($1, $2)", event.key, event.body.decode())


record.batchable = True
