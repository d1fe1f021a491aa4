"""A dead letter can always be recorded, whatever the event holds (issue 10,
item 4): a body jsonb refuses keeps its raw bytes with no parsed copy, and
header values with undecodable bytes are stored, not raised on. Also the
worker's side (workers/claim/retry FailurePolicy.dead_letter): the failure
counted in its incident in the same transaction, never at the dead letter's
expense."""

import asyncpg
import pytest

from tests.support.events import make_event
from webhook_ingest.shared.dead_letters.model import record_dead_letter
from webhook_ingest.shared.dead_letters.store import DeadLetterStore
from webhook_ingest.workers.claim.retry import FailurePolicy, describe_failure
from webhook_ingest.workers.handlers import PermanentError

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


# -- the worker's dead letter also counts the failure in its incident (fee867c);
# what the count cannot write never keeps the dead letter from committing


@pytest.fixture
async def pool(database):
    pool = await asyncpg.create_pool(database, min_size=1, max_size=2)
    yield pool
    await pool.close()


async def _rows(pool, query: str) -> list[dict]:
    async with pool.acquire() as connection:
        return [dict(row) for row in await connection.fetch(query)]


async def test_an_error_quoting_a_nul_and_a_lone_surrogate_is_dead_lettered_and_counted(pool):
    """R6-1, R6-2: the text Postgres refuses is written as U+FFFD, in the
    incident as in the dead letter (before: DataError, nothing committed)."""
    error = describe_failure(PermanentError("the CRM answered: name\x00 caf\udce9"), 1)
    dead_letter_id = await FailurePolicy(None, pool, "unused").dead_letter(
        make_event("acme", "evt_unstorable"), error, permanent=True, handler="forward"
    )
    assert dead_letter_id is not None
    [incident] = await _rows(pool, "SELECT last_error, error_pattern, dead_letters FROM incidents")
    assert incident == {
        "last_error": "the CRM answered: name\ufffd caf\ufffd",
        "error_pattern": "the CRM answered: name\ufffd caf\ufffd",
        "dead_letters": 1,
    }


async def test_a_count_postgres_refuses_does_not_refuse_the_dead_letter(pool):
    """Whatever Postgres refuses in the count (here a trigger raising
    check_violation on incident_events: a constraint added later, a value
    out of range), the dead letter commits without it. Before, the refusal
    left `dead_letter`, the worker took it for its own crash and ran the
    handler again, up to the delivery limit."""
    async with pool.acquire() as connection:
        await connection.execute("""
            CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'refused' USING ERRCODE = 'check_violation'; END $$;
            CREATE TRIGGER refuse BEFORE INSERT ON incident_events FOR EACH ROW EXECUTE FUNCTION refuse();
        """)
    error = describe_failure(PermanentError("refused for good"), 1)
    dead_letter_id = await FailurePolicy(None, pool, "unused").dead_letter(
        make_event("acme", "evt_refused_count"), error, permanent=True, handler="forward"
    )
    assert dead_letter_id is not None
    assert await _rows(pool, "SELECT id, status FROM dead_letters") == [{"id": dead_letter_id, "status": "dead"}]
    assert await _rows(pool, "SELECT id FROM incidents") == []  # the count rolled back to its savepoint, alone


async def test_an_open_dead_letter_recorded_again_is_not_counted_again_in_its_incident(pool):
    """Copies of an event a worker does not know the source of wait apart
    (`unknown_source_waiting`), and each becomes a dead letter after 10
    minutes: the second finds the first open and records nothing — and
    the incident counted a second dead letter (finding R6-4), which
    "replay its open dead letters" then did not find. The same for an
    attempt run again (B4, B6) whose last attempt fails again. The second
    failure still counts as a failure."""
    policy = FailurePolicy(None, pool, "unused")
    event = make_event("acme", "evt_copied")
    error = {
        "attempt": 1,
        "at": "2026-11-25T00:00:00+00:00",
        "type": "UnknownSource",
        "message": "no worker knew source 'acme' for 600 s",
    }
    ids = {await policy.dead_letter(event, error), await policy.dead_letter(event, error)}
    assert len(ids) == 1
    assert await _rows(pool, "SELECT failures, dead_letters FROM incidents") == [{"failures": 2, "dead_letters": 1}]
