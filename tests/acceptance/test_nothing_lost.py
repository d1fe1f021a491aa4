"""Nothing lost (docs/reference.md §7.3), with real worker processes and real
services: a message is acknowledged only once its completion, its retry
message or its dead letter is durably recorded, so an event answered 200
always ends somewhere.

Covers a retry or a replay waiting behind a stale copy of an earlier attempt
(settled duplicate or deferred), which must not be acked with it unrun, and
another payload sent under a dead-lettered key.

The ingress's outbox and redelivery counting: test_outbox.py,
test_redelivery_accounting.py, test_batched_acks.py."""

import asyncio
import dataclasses

import asyncpg
import pytest

from tests.support.events import make_event, publish_events
from tests.support.exactly_once import write_sources
from tests.support.outcomes import fetchrow as _fetchrow
from tests.support.outcomes import queue_empty as _queue_empty
from tests.support.outcomes import settled_quietly as _settled_quietly
from tests.support.processes import count_rows, wait_for_output, wait_until
from webhook_ingest.shared.dead_letters.model import record_dead_letter

pytestmark = pytest.mark.usefixtures("effects_tables")
HANDLERS = "tests.support.handlers"
ADVERSARY = HANDLERS  # what the tests found in review rounds call it (they had a handlers module of their own)


async def _execute(database_url: str, sql: str, *args) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(sql, *args)
    finally:
        await connection.close()


async def _settled_somehow(database_url: str, key: str) -> dict:
    """What on-call or the provider could see of the event: completed, or an open dead letter."""
    connection = await asyncpg.connect(database_url)
    try:
        return {
            "completed": await connection.fetchval("SELECT count(*) FROM processed_events WHERE key = $1", key),
            "open_dead_letters": await connection.fetchval(
                "SELECT count(*) FROM dead_letters WHERE key = $1 AND status = 'dead'", key
            ),
        }
    finally:
        await connection.close()


async def _anywhere(database_url: str, key: str) -> bool:
    return any((await _settled_somehow(database_url, key)).values())


async def test_a_retry_waiting_behind_a_stale_copy_of_its_earlier_attempt_is_not_dropped(settings, fleet, tmp_path):
    """Attempt 1 of an event failed and was handed on: its retry (attempt 2)
    is durable and key_fences records attempt 1 as handed on (the state
    `record_handed_on` leaves). A copy of attempt 1 — the provider sending
    the event again, the outbox relay republishing the event whose given-up
    publish the broker confirmed late, a redelivery — reaches the worker
    just before the retry. The copy leads (workers/claim/copies.py), is found
    stale (`attempt_already_handed_on`) and settled DUPLICATE; the retry,
    waiting behind it with the same payload, is then acked as a duplicate
    of it without running. Nothing carries the event on: it must still end
    completed (attempt 2 runs) or as an open dead letter."""
    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", f"{HANDLERS}:counted_inbox")}
    first = make_event("acme", "evt_stale_leader")
    retry = first.next_attempt(
        {"attempt": 1, "at": "2026-11-23T00:00:00+00:00", "type": "RuntimeError", "message": "the receiver was down"}
    )
    await _execute(
        settings.database_url,
        "INSERT INTO key_fences (key, token, replay_of, attempt, payload_sha256) "
        "VALUES ($1, nextval('fencing_tokens'), 0, 1, $2)",
        first.key,
        first.payload_sha256,
    )
    await publish_events(settings.amqp_url, settings.namespace, [first])  # the stale copy, first in the queue
    await publish_events(settings.amqp_url, settings.namespace, [retry])  # the retry, right behind it
    worker = fleet.worker("--concurrency", "8", env=env)
    await wait_for_output(worker, "worker_consuming")
    await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
    await asyncio.sleep(3)  # a deferral would be back within 1 s

    assert "attempt_already_handed_on" in worker.output()  # the stale copy was recognised
    assert await _settled_somehow(settings.database_url, first.key) != {"completed": 0, "open_dead_letters": 0}


async def test_a_replay_waiting_behind_a_stale_copy_of_the_dead_chain_is_not_dropped(settings, fleet, tmp_path):
    """A1 seen from on-call: the event's chain ended in a dead letter after
    attempt 3 (key_fences: chain 0, attempt 3 handed on). The provider sends
    the event once more (chain 0, attempt 1: a copy the design acks as a
    duplicate while the dead letter is open) just as on-call replays the
    dead letter (a new chain, attempt 1). The copy leads, is stale, is
    settled DUPLICATE; the replay waits behind it and is acked as its
    duplicate. The dead letter is `replayed`, so on-call sees nothing left
    to do — the replay must still end completed or as a new open dead letter."""
    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", f"{HANDLERS}:counted_inbox")}
    event = make_event("acme", "evt_replay_behind_stale")
    connection = await asyncpg.connect(settings.database_url)
    try:
        dead_letter_id = await record_dead_letter(
            connection,
            dataclasses.replace(event, attempt=3),
            [
                {"attempt": n, "at": "2026-11-23T00:00:00+00:00", "type": "RuntimeError", "message": "down"}
                for n in (1, 2, 3)
            ],
        )
        await connection.execute(
            "INSERT INTO key_fences (key, token, replay_of, attempt, payload_sha256) "
            "VALUES ($1, nextval('fencing_tokens'), 0, 3, $2)",
            event.key,
            event.payload_sha256,
        )
        await connection.execute("UPDATE dead_letters SET status = 'replayed' WHERE id = $1", dead_letter_id)
    finally:
        await connection.close()
    await publish_events(settings.amqp_url, settings.namespace, [event])  # the provider's copy, chain 0
    await publish_events(settings.amqp_url, settings.namespace, [event.fresh(replay_of=dead_letter_id)])  # the replay
    worker = fleet.worker("--concurrency", "8", env=env)
    await wait_for_output(worker, "worker_consuming")
    await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
    await asyncio.sleep(3)

    assert "attempt_already_handed_on" in worker.output()
    assert await _settled_somehow(settings.database_url, event.key) != {"completed": 0, "open_dead_letters": 0}


async def test_a_retry_waiting_behind_a_deferred_stale_copy_is_not_dropped(settings, fleet, tmp_path):
    """A1 through DEFERRED rather than DUPLICATE: as in the first test,
    attempt 1 was handed on and its retry (attempt 2) arrives right behind
    a stale copy of attempt 1 — but the key's lease is held elsewhere for a
    few seconds (another worker's run of a copy), so the stale copy is
    deferred before it can find out it is stale. Its deferral message
    "carries the event on" for copies.py, and the retry waiting behind it
    is acked; the deferral, back later, is stale (`attempt_already_handed_on`)."""
    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", f"{HANDLERS}:counted_inbox")}
    first = make_event("acme", "evt_deferred_stale_leader")
    retry = first.next_attempt(
        {"attempt": 1, "at": "2026-11-23T00:00:00+00:00", "type": "RuntimeError", "message": "the receiver was down"}
    )
    await _execute(
        settings.database_url,
        "INSERT INTO key_fences (key, token, lease_until, replay_of, attempt, payload_sha256) "
        "VALUES ($1, nextval('fencing_tokens'), clock_timestamp() + interval '4 seconds', 0, 1, $2)",
        first.key,
        first.payload_sha256,
    )
    await publish_events(settings.amqp_url, settings.namespace, [first])
    await publish_events(settings.amqp_url, settings.namespace, [retry])
    worker = fleet.worker("--concurrency", "8", env=env)
    await wait_for_output(worker, "worker_consuming")
    # Either the stale deferral comes back first (attempt_already_handed_on) and
    # the retry then runs, or the retry runs first and the deferral finds it done.
    await wait_until(
        lambda: _anywhere(settings.database_url, first.key), 30, message="the event completed or dead-lettered"
    )
    await wait_until(lambda: _queue_empty(settings), 30, message="an empty queue")
    await asyncio.sleep(2)

    assert await _settled_somehow(settings.database_url, first.key) != {"completed": 0, "open_dead_letters": 0}
    assert "batch_crashed" not in worker.output()  # a batch whose keys are all leased elsewhere is no crash


async def test_another_payload_under_a_dead_lettered_key_is_recorded_somewhere(settings, fleet, tmp_path):
    """The receiver is down and the event's chain ends in a dead letter.
    The provider then sends the key again with another payload (a
    corrected event). Whatever the right outcome — run (the key never
    completed), a dead letter of its own, or a conflict recorded for
    operators (§5) — an event answered 200 must end somewhere (§7.3). It is
    acked as a copy of chain 0's attempt 3 and leaves no trace: discard the
    first dead letter and the second payload is lost."""
    sources = write_sources(tmp_path / "s.toml", f"{ADVERSARY}:failing_external", database_url=settings.database_url)
    worker = fleet.worker("--concurrency", "1", env={"WEBHOOK_INGEST_SOURCES": sources})
    await wait_for_output(worker, "worker_consuming")
    first = make_event("acme", "evt_corrected", {"amount": 100})
    await publish_events(settings.amqp_url, settings.namespace, [first])
    await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 30, message="the dead letter")
    await _settled_quietly(settings, 1)

    corrected = make_event("acme", "evt_corrected", {"amount": 101})
    await publish_events(settings.amqp_url, settings.namespace, [corrected])
    await _settled_quietly(settings)

    traces = await _fetchrow(
        settings.database_url,
        """
        SELECT (SELECT count(*) FROM runs WHERE started = 1) - 1 AS runs,
               (SELECT count(*) FROM dead_letters WHERE payload_sha256 = $1) AS dead_letters,
               (SELECT count(*) FROM event_conflicts WHERE conflicting_sha256 = $1) AS conflicts,
               (SELECT count(*) FROM processed_events WHERE payload_sha256 = $1) AS completed""",
        corrected.payload_sha256,
    )
    assert any(dict(traces).values()), (dict(traces), "attempt_already_handed_on" in worker.output())
