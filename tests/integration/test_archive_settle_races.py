"""The settling sweep against what changes a row between its page's read and
its settle (ArchiveStore.settle: two statements, shared/archive/settling.py
deciding in between). Real Postgres; on-call's replay is the real
`dlq replay`, run at that moment."""

import dataclasses
import threading
import time

from click.testing import CliRunner

from tests.support.archive import arrival_of, arrived, statuses
from tests.support.dead_letters import failure
from webhook_ingest.cli.main import main
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.archive import settling as archive_settling
from webhook_ingest.shared.dead_letters.model import record_dead_letter

ROUTES: dict[str, list[str]] = {}


def _replayed_meanwhile(monkeypatch, dead_letter_id: int) -> None:
    """On-call replays the dead letter once the sweep has read its page, before it settles it."""
    decide = archive_settling.settled

    def settled(rows):
        done = []
        thread = threading.Thread(
            target=lambda: done.append(CliRunner().invoke(main, ["dlq", "replay", str(dead_letter_id)]))
        )
        thread.start()
        thread.join(30)
        assert done and done[0].exit_code == 0, done and done[0].output
        return decide(rows)

    monkeypatch.setattr(archive_settling, "settled", settled)


async def test_a_dead_letter_replayed_while_the_sweep_settles_its_arrival_ends_as_the_replay_does(
    archive_store, settings, monkeypatch
):
    event = arrival_of("acme", "evt_1", 5)
    await arrived(archive_store, event)  # queued: every note of its chain lost with killed workers
    dead_letter = await record_dead_letter(
        archive_store._database, dataclasses.replace(event, attempt=3), [failure(1), failure(2), failure(3)]
    )
    _replayed_meanwhile(monkeypatch, dead_letter)
    await archive_store.settle(0, ROUTES)
    replay_of = await archive_store._database.fetchval("SELECT replay_of FROM event_archive WHERE key = $1", event.key)
    assert replay_of > 0  # the replay's chain
    settled = await statuses(archive_store, event.key)
    # the replay's run completes and its worker writes its outcome
    await archive_store.write_outcomes(
        [
            archive.outcome_row(
                dataclasses.replace(event, replay_of=replay_of, attempt=1), archive.PROCESSED, time.time()
            )
        ]
    )
    assert settled == [("queued", 0)]  # queued again, in the replay's chain, as the replay left it
    assert await statuses(archive_store, event.key) == [("processed", 1)]


async def test_a_lost_outcome_in_another_source_s_table_of_the_same_millisecond_is_not_skipped(archive_store):
    """1c359b8's cursor across sources: rows of one millisecond in two
    sources' day tables, a page of 2 ending in the first source's, the lost
    outcome in the second's. The page after starts at that source's rows."""
    first = arrival_of("acme", "evt_s0", 10)
    waiting = dataclasses.replace(arrival_of("acme", "evt_s1", 10), received_at=first.received_at)
    done = dataclasses.replace(arrival_of("routed", "evt_s2", 10), received_at=first.received_at)
    await arrived(archive_store, first, waiting, done)  # nothing recorded of the first two: on their way
    await archive_store._database.execute(
        "INSERT INTO processed_events (key, source, event_id, payload_sha256, attempts, arrival)"
        " VALUES ($1, $2, $3, $4, 1, $5)",
        done.key,
        done.source,
        done.event_id,
        done.payload_sha256,
        done.arrival,
    )
    settled, after = await archive_store.settle(0, ROUTES, limit=2)
    assert (settled, after is not None) == (0, True)  # the page: acme's two, on their way
    settled, after = await archive_store.settle(0, ROUTES, after=after, limit=2)
    assert (settled, after) == (1, None)
    assert await statuses(archive_store, done.key) == [("processed", 1)]
