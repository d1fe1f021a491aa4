"""Handlers the routes tests configure (tests/acceptance/test_routes.py).

Each run leaves a row in `effects` (no unique key), through `ctx.db`, so a
second run of one (event, route) shows as a second row.
"""

import asyncio
import os

from tests.support.handlers import counted_inbox


async def fails_while_flagged(event, ctx):
    """Fails while the file `ctx.options["fail_file"]` exists, else counted_inbox."""
    if await asyncio.to_thread(os.path.exists, ctx.options["fail_file"]):
        raise RuntimeError(f"route {event.route} told to fail")
    await counted_inbox(event, ctx)


async def counted_route(event, ctx):
    """counted_inbox: one `effects` row per run, under the route's key."""
    await counted_inbox(event, ctx)
