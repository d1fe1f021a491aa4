"""An ended replay's items whose events left the archive, held back by its
oldest item's key arriving again and again (attacker review of 2a0ce2d).
design.md ("A replay by selection") says the items "last while their
events are archived, and at least a day past the replay's end"; the
upkeep only takes replays whose oldest item left is gone
(event_replays_to_prune) and stops at the first still archived, so one
key archived again on every kept day — a provider resending one event id,
a source hashing a recurring identical body (`sha256:…` ids: a heartbeat)
— keeps every later item of the replay for ever, events long gone. Real
Postgres."""

from datetime import UTC, datetime, time, timedelta

import asyncpg
import pytest

from tests.support.archive import archived_event, seed_archive
from webhook_ingest.shared.archive_store import ArchiveStore
from webhook_ingest.shared.archive_upkeep import ArchiveUpkeep
from webhook_ingest.shared.archived_events import parse_filter
from webhook_ingest.shared.dead_letters import Actor
from webhook_ingest.shared.event_replay_store import EventReplayStore
from webhook_ingest.shared.sources import parse_source

NOW = datetime.now(UTC)
MIDNIGHT = datetime.combine(NOW.date(), time(), UTC)
YESTERDAY = MIDNIGHT - timedelta(hours=6)
A_WEEK_ON = NOW + timedelta(days=7)  # the oldest day kept is today: yesterday goes
SOURCES = {"acme": parse_source("acme", {"scheme": "github", "secrets": ["s"], "handler": "inbox"})}


@pytest.mark.xfail(strict=True, reason="event_replays_to_prune takes a replay only when its oldest item left is gone: "
                                       "a recurring key first in the replay holds back its gone items for ever")
async def test_items_whose_events_left_the_archive_go_though_the_replay_s_first_key_arrives_again(database):
    # `heartbeat` first (yesterday, and again today: a key that recurs), then two events of yesterday only
    await seed_archive(database, [archived_event("acme", "heartbeat", YESTERDAY),
                                  archived_event("acme", "old_1", YESTERDAY + timedelta(seconds=1)),
                                  archived_event("acme", "old_2", YESTERDAY + timedelta(seconds=2)),
                                  archived_event("acme", "heartbeat", MIDNIGHT + timedelta(seconds=5))])
    connection = await asyncpg.connect(database)
    try:
        replay = await EventReplayStore(connection).prepare(parse_filter({"source": "acme"}), Actor.cli())
        assert replay.total == 3
        await connection.execute("UPDATE event_replays SET state = 'done', next_item = 4, published = 3,"
                                 " finished_at = now() - interval '2 days' WHERE id = $1", replay.id)
        await ArchiveStore(connection).keep({"acme": timedelta(days=7)}, now=A_WEEK_ON)
        assert await ArchiveStore(connection).event("acme:old_1") is None  # no page: nothing shows its item
        await ArchiveUpkeep(ArchiveStore(connection), SOURCES).prune()
        left = [row["key"] for row in await connection.fetch(
            "SELECT key FROM event_replay_items WHERE replay_id = $1 ORDER BY item", replay.id)]
    finally:
        await connection.close()
    assert left == ["acme:heartbeat"]
