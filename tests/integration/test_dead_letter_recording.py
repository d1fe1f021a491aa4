"""A dead letter can always be recorded, whatever the event holds (issue 10,
item 4): a body jsonb refuses keeps its raw bytes with no parsed copy, and
header values with undecodable bytes are stored, not raised on."""

import asyncpg
import pytest

from tests.support.events import make_event
from webhook_ingest.shared.dead_letters.model import record_dead_letter
from webhook_ingest.shared.dead_letters.store import DeadLetterStore

UNSTORABLE_BODIES = [
    b'{"id":"e1","t":"\\ud83d"}',  # half an emoji
    b'{"id":"e1","n":1e400}',  # beyond float and jsonb
    b'{"id":"e1","t":"a\\u0000b"}',  # NUL, which jsonb refuses
    b'\xff\xfe{"id":"e1"}',  # not UTF-8
]


@pytest.mark.parametrize("body", UNSTORABLE_BODIES)
async def test_an_unstorable_body_is_still_recorded_with_its_raw_bytes(database, body):
    event = make_event("acme", "e1")
    event = type(event)(**{**event.__dict__, "body": body, "headers": {"x-odd": "caf\udce9", "x-ok": "yes"}})
    connection = await asyncpg.connect(database)
    try:
        dead_letter_id = await record_dead_letter(connection, event, [{"attempt": 1, "type": "E", "message": "m"}])
        row = await DeadLetterStore(connection).get(dead_letter_id)
        raw = await connection.fetchval("SELECT body FROM dead_letters WHERE id = $1", dead_letter_id)
    finally:
        await connection.close()
    assert raw == body  # what a replay publishes
    assert row["payload"] is None
    assert row["headers"]["x-ok"] == "yes" and row["headers"]["x-odd"].startswith("caf")
