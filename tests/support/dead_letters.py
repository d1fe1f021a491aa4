"""Dead letters made the way a worker makes them (`record_dead_letter`), for
tests of the tools on-call uses."""

import dataclasses

import asyncpg

from tests.support.events import make_event
from webhook_ingest.shared.dead_letters.model import record_dead_letter
from webhook_ingest.workers.claim.retry import describe_failure


def failure(attempt: int, text: str = "receiver answered 500") -> dict:
    """A failed attempt as a worker records it, with a real traceback."""
    try:
        raise RuntimeError(f"{text} (attempt {attempt})")
    except RuntimeError as exc:
        return describe_failure(exc, attempt)


async def seed_dead_letters(
    database_url: str, source: str, count: int, start: int = 0, attempts: int = 3, text: str = "receiver answered 500"
) -> list[int]:
    """`count` dead letters of `source` (event ids evt_START…), their ids in order."""
    connection = await asyncpg.connect(database_url)
    try:
        ids = []
        for n in range(start, start + count):
            event = make_event(source, f"evt_{n}", {"amount": n * 100, "customer": {"id": f"cus_{n}"}})
            errors = [failure(attempt, text) for attempt in range(1, attempts + 1)]
            ids.append(await record_dead_letter(connection, dataclasses.replace(event, attempt=attempts), errors))
        return ids
    finally:
        await connection.close()
