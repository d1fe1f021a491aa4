"""The bench's handler: one INSERT through the completion transaction, like
the built-in `inbox`, into a table without a unique key, so a second run of
an event would show as a second row (`duplicated_effects`) instead of a
failed insert. The slow phases' handlers (tests/bench/slow_handlers.py)
call a downstream through the built-in `forward` too."""

import asyncio

from webhook_ingest.workers.handlers.forward import handle as forward

EFFECTS_TABLE = "CREATE TABLE bench_effects (key text NOT NULL, payload jsonb NOT NULL)"


async def record(event, ctx) -> None:
    await ctx.db.execute("INSERT INTO bench_effects (key, payload) VALUES ($1, $2)", event.key, event.body.decode())


async def record_many(events, ctx) -> None:
    """`record` for a batch's events in one statement (its batch form, as the built-in `inbox` has)."""
    await ctx.db.execute(
        "INSERT INTO bench_effects (key, payload) SELECT * FROM unnest($1::text[], $2::jsonb[])",
        [event.key for event in events],
        [event.body.decode() for event in events],
    )


record.batchable = True
record.batch = record_many


async def record_while_calling(event, ctx) -> None:
    """A `ctx.db` handler of 300 ms: writes, then calls the downstream
    (`forward`) with its transaction open, as a handler that reserves a row
    and then charges a card would."""
    await record(event, ctx)
    await forward(event, ctx)


async def call_then_record(event, ctx) -> None:
    """Calls the downstream, then writes: its transaction opens only after
    the network wait."""
    await forward(event, ctx)
    await record(event, ctx)


HOT_KEY_HANDLER_SECONDS = 0.005  # the ordering phase's hot key (tests/bench/ordering.py): 200 events/s alone


async def record_after_work(event, ctx) -> None:
    """5 ms of work (a fast API call), then `record`'s row through
    `ctx.db`: the handler whose own rate (200 events/s one at a time) a
    hot ordering key is measured against."""
    await asyncio.sleep(HOT_KEY_HANDLER_SECONDS)
    await record(event, ctx)
