"""Replaying archived events by filter and window (issue 22, item 5): the
selection and its freezing in real Postgres, the dry-run count and the run
through `webhook-ingest events replay` and the admin API's
POST /admin/events/replay. What the workers make of the replayed messages:
tests/acceptance/test_event_replays.py."""

import asyncio
import contextlib
import dataclasses
import html
import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import aio_pika
import asyncpg
import pytest
from click.testing import CliRunner

from tests.support.archive import archived_event, minutes_ago, seed_archive
from tests.support.console import csrf_of
from tests.support.dead_letters import failure
from tests.support.event_replays import DiesAfterItsFirstPublish, SlowArrivalRead, claimed_replay, replay_job
from tests.support.events import publish_events
from tests.support.ingress import console_login, queued_events, running_ingress
from tests.support.processes import wait_until
from tests.support.pruning import A_WEEK_ON, DAY, MIDNIGHT, SOURCES, TOMORROW, YESTERDAY
from webhook_ingest.cli.dlq import confirm_channel
from webhook_ingest.cli.main import main
from webhook_ingest.shared import upkeep as archive_upkeep
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.archive.search import parse_filter
from webhook_ingest.shared.archive.store import ArchiveStore
from webhook_ingest.shared.audit.actor import Actor
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.dead_letters.model import record_dead_letter
from webhook_ingest.shared.replays import store as event_replay_store
from webhook_ingest.shared.replays.keys import parse, replay_key
from webhook_ingest.shared.replays.model import ReplayItem, replayed_message
from webhook_ingest.shared.replays.store import EventReplayStore
from webhook_ingest.shared.runs import locks as run_locks
from webhook_ingest.shared.runs import paced as paced_runs
from webhook_ingest.shared.runs.paced import run
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources
from webhook_ingest.shared.upkeep import ArchiveUpkeep
from webhook_ingest.workers.fan_out import route_messages

TOKEN = "s3cret-admin-token-of-the-event-replay-tests"
VIEWER = "s3cret-viewer-token-of-the-event-replay-tests"
NOW = datetime.now(UTC).replace(microsecond=0)
SINCE, UNTIL = (NOW - timedelta(minutes=70)).isoformat(), (NOW - timedelta(minutes=20)).isoformat()


def at(minutes_ago: int) -> datetime:
    return NOW - timedelta(minutes=minutes_ago)


@pytest.fixture
def admin_settings(settings, monkeypatch) -> Settings:
    monkeypatch.setenv("WEBHOOK_INGEST_ADMIN_TOKEN", TOKEN)
    monkeypatch.setenv("WEBHOOK_INGEST_VIEWER_TOKEN", VIEWER)
    return Settings()


@pytest.fixture
async def window(settings):
    """stripe's invoice.paid in the window [70, 20) minutes ago: evt_1 (processed,
    a copy of it, and another payload under its key: a conflict), evt_2 (dead),
    evt_5 (ignored); around them what the filter leaves out."""
    paid_1 = archived_event("stripe", "evt_1", at(60), "invoice.paid", customer="cus_1")
    copy_1 = dataclasses.replace(paid_1, received_at=at(50).timestamp())
    paid_2 = archived_event("stripe", "evt_2", at(40), "invoice.paid", customer="cus_2")
    other_1 = archived_event("stripe", "evt_1", at(35), "invoice.paid", customer="cus_other")  # another payload
    ignored = archived_event("stripe", "evt_5", at(30), "invoice.paid")
    created = archived_event("stripe", "evt_3", at(45), "invoice.created")
    early = archived_event("stripe", "evt_0", at(90), "invoice.paid")
    late = archived_event("stripe", "evt_9", at(10), "invoice.paid")
    push = archived_event("github", "d-1", at(45), "invoice.paid")
    done = NOW.timestamp()
    await seed_archive(
        settings.database_url,
        [paid_1, copy_1, paid_2, other_1, ignored, created, early, late, push],
        [
            archive.outcome_row(paid_1, archive.PROCESSED, done),
            archive.outcome_row(copy_1, archive.DUPLICATE, done),
            archive.outcome_row(paid_2, archive.DEAD, done, "RuntimeError: 500"),
            archive.outcome_row(other_1, archive.CONFLICT, done),
        ],
    )
    connection = await asyncpg.connect(settings.database_url)
    try:
        await connection.execute("UPDATE event_archive SET status = 'ignored' WHERE key = $1", ignored.key)
    finally:
        await connection.close()
    return {"paid_1": paid_1, "paid_2": paid_2}


def stripe_paid(**more):
    return parse_filter({"source": "stripe", "type": "invoice.paid", "since": SINCE, "until": UNTIL, **more})


def events(*args: str):
    return CliRunner().invoke(main, ["events", *args])


async def test_a_selection_takes_each_matching_event_once_and_is_frozen_when_prepared(settings, window):
    connection = await asyncpg.connect(settings.database_url)
    try:
        store = EventReplayStore(connection)
        assert await store.count(stripe_paid()) == 2  # evt_1 (its copy folded in, its conflict left out) and evt_2
        replay = await store.prepare(stripe_paid(), Actor.cli())
        assert (replay.total, replay.state, replay.next_item, replay.created_by) == (2, "prepared", 1, f"{Actor.cli()}")
        assert replay.filter == {"source": "stripe", "type": "invoice.paid", "since": SINCE, "until": UNTIL}
        frozen = [(item.item, item.key, item.received_at) for item in [i async for i in store.items(replay.id, 1)]]
        assert frozen == [(1, "stripe:evt_1", at(60)), (2, "stripe:evt_2", at(40))]  # the oldest arrival, in order

        later = archived_event("stripe", "evt_7", at(25), "invoice.paid")  # arrives in the window after the freeze
        await seed_archive(settings.database_url, [later])
        assert await store.count(stripe_paid()) == 3
        assert [i.key async for i in store.items(replay.id, 1)] == ["stripe:evt_1", "stripe:evt_2"]
        assert (await store.get(replay.id)).total == 2
        again = await store.prepare(stripe_paid(), Actor.cli())
        assert again.id > replay.id and again.total == 3
        assert await store.count(stripe_paid(status="dead")) == 1
        assert await store.count(parse_filter({"payload": '{"customer": "cus_1"}'})) == 1
    finally:
        await connection.close()


def test_replay_keys_split_back_into_one_replay_and_key_only():
    assert replay_key("stripe:evt_1", 7) == "replay-7/stripe:evt_1"
    assert parse("replay-7/stripe:evt_1") == (7, "stripe:evt_1")
    assert parse("replay-7/stripe:evt_1#billing") == (7, "stripe:evt_1#billing")
    for original in ("stripe:evt_1", "stripe:replay-7/x", "replay-7:x", "replay-07/a:b", "replay-/a:b", "replay-7"):
        assert parse(original) is None, original


def test_the_cli_counts_first_then_replays_the_frozen_selection_under_new_keys(settings, window):
    window_options = ["--source", "stripe", "--type", "invoice.paid", "--since", SINCE, "--until", UNTIL]
    asyncio.run(publish_events(settings.amqp_url, settings.namespace, []))  # the queue, to see it stays empty
    dry = events("replay", *window_options, "--dry-run")
    assert dry.exit_code == 0, dry.stderr
    assert dry.stdout.strip() == "2 events would be replayed"
    assert json.loads(events("replay", *window_options, "--dry-run", "--json").stdout) == {"dry_run": True, "count": 2}
    assert asyncio.run(queued_events(settings.amqp_url, settings.namespace)) == []

    declined = CliRunner().invoke(main, ["events", "replay", *window_options], input="n\n")
    assert declined.exit_code == 2 and "cancelled: nothing was published" in declined.stderr
    assert asyncio.run(queued_events(settings.amqp_url, settings.namespace)) == []

    first = events("replay", *window_options, "--yes", "--rate", "1000", "--json")
    assert first.exit_code == 0, first.stderr
    document = json.loads(first.stdout)
    assert (document["state"], document["total"], document["published"], document["skipped"]) == ("done", 2, 2, 0)
    queued = asyncio.run(queued_events(settings.amqp_url, settings.namespace))
    replay_id = document["id"]
    assert [(e.key, e.attempt, e.replay_of, e.route) for e in queued] == [
        (f"replay-{replay_id}/stripe:evt_1", 1, 0, ""),
        (f"replay-{replay_id}/stripe:evt_2", 1, 0, ""),
    ]
    assert queued[0].body == window["paid_1"].body and queued[0].event_id == "evt_1"
    assert queued[0].payload_sha256 == window["paid_1"].payload_sha256
    assert queued[0].received_at == window["paid_1"].received_at and queued[0].headers == window["paid_1"].headers

    second = json.loads(events("replay", *window_options, "--yes", "--rate", "1000", "--json").stdout)
    assert second["id"] > replay_id  # a new replay: new keys, so each event runs once more
    assert {e.key for e in asyncio.run(queued_events(settings.amqp_url, settings.namespace))} == {
        f"replay-{second['id']}/stripe:evt_1",
        f"replay-{second['id']}/stripe:evt_2",
    }

    shown = json.loads(events("replay", "--show", str(replay_id), "--json").stdout)
    assert shown == document
    assert events("replay", "--resume", str(replay_id)).exit_code == 2  # done: not waiting to run
    assert events("replay", "--show", "999999").stderr.strip() == "error: no replay 999999"
    nothing = events("replay", "--source", "nosuch", "--yes")
    assert nothing.exit_code == 2 and "nothing to replay" in nothing.stderr
    assert "invalid --since" in events("replay", "--since", "yesterday", "--dry-run").stderr


async def test_the_admin_api_counts_runs_shows_and_cancels_a_replay(admin_settings, window):
    auth, viewer = {"Authorization": f"Bearer {TOKEN}"}, {"Authorization": f"Bearer {VIEWER}"}
    asked = {"source": "stripe", "type": "invoice.paid", "since": SINCE, "until": UNTIL}
    async with running_ingress(admin_settings, load_sources(None)) as client:
        dry = await client.post("/admin/events/replay", json=asked | {"dry_run": True}, headers=auth)
        assert (dry.status, await dry.json()) == (200, {"dry_run": True, "count": 2})
        assert (await client.post("/admin/events/replay", json=asked, headers=viewer)).status == 403
        bad = await client.post("/admin/events/replay", json={"since": "yesterday"}, headers=auth)
        assert (bad.status, (await bad.json())["error"]) == (400, "invalid_since")
        bad = await client.post("/admin/events/replay", json=asked | {"rate": 0}, headers=auth)
        assert (bad.status, (await bad.json())["error"]) == (400, "invalid_rate")
        payload = await client.post(
            "/admin/events/replay", json={"payload": {"customer": "cus_2"}, "dry_run": True}, headers=auth
        )
        assert (await payload.json())["count"] == 1

        started = await client.post("/admin/events/replay", json=asked | {"rate": 1000}, headers=auth)
        assert started.status == 202, await started.text()
        replay_id = (await started.json())["id"]

        async def finished() -> bool:
            shown = await (await client.get(f"/admin/events/replay/{replay_id}", headers=viewer)).json()
            return shown["state"] == "done"

        await wait_until(finished, 10, message="the replay done")
        shown = await (await client.get(f"/admin/events/replay/{replay_id}", headers=auth)).json()
        assert (shown["total"], shown["published"], shown["handled"], shown["created_by"]) == (
            2,
            2,
            2,
            "operator (admin-api)",
        )
        keys = [e.key for e in await queued_events(admin_settings.amqp_url, admin_settings.namespace)]
        assert keys == [f"replay-{replay_id}/stripe:evt_1", f"replay-{replay_id}/stripe:evt_2"]
        ended = await client.post(f"/admin/events/replay/{replay_id}/cancel", headers=auth)
        assert (ended.status, (await ended.json())["error"]) == (409, "already_ended")
        assert (await client.get("/admin/events/replay/999999", headers=auth)).status == 404

        slow = await client.post("/admin/events/replay", json=asked | {"rate": 0.2}, headers=auth)  # one per 5 s
        slow_id = (await slow.json())["id"]
        cancelled = await client.post(f"/admin/events/replay/{slow_id}/cancel", headers=auth)
        assert (cancelled.status, (await cancelled.json())["state"]) == (200, "cancelled")
        await asyncio.sleep(0.5)  # its runner sees the cancel before its next item
        shown = await (await client.get(f"/admin/events/replay/{slow_id}", headers=auth)).json()
        assert shown["state"] == "cancelled" and shown["published"] < 2
        queued = await queued_events(admin_settings.amqp_url, admin_settings.namespace)
        assert len(queued) == shown["published"]
        resumed = await client.post(f"/admin/events/replay/{slow_id}/resume", json={}, headers=auth)
        assert resumed.status == 409  # cancelled for good

    connection = await asyncpg.connect(admin_settings.database_url)
    try:
        audit = await connection.fetch("SELECT action, via, detail FROM audit_log ORDER BY id")
    finally:
        await connection.close()
    first = [
        (row["action"], json.loads(row["detail"]))
        for row in audit
        if json.loads(row["detail"])["event_replay_id"] == replay_id
    ]
    assert [action for action, _ in first] == ["events_replay_started", "events_replay"]
    assert first[0][1]["total"] == 2 and first[1][1]["published"] == 2 and first[1][1]["state"] == "done"
    assert first[0][1]["filter"] == asked


async def test_a_cancel_that_cannot_take_the_run_in_time_is_refused_and_changes_nothing(
    admin_settings, window, monkeypatch
):
    """A Cancel waits for the item in flight (the runner holds the run's row
    from its state read to its step: shared/runs/locks.py), at most
    WAIT_SECONDS; past it a 503 run_busy, the replay as it was. A Resume
    meanwhile is 409 not_waiting: the row's holder runs it."""
    monkeypatch.setattr(run_locks, "WAIT_SECONDS", 0.5)  # a fast test
    auth = {"Authorization": f"Bearer {TOKEN}"}
    asked = {"source": "stripe", "type": "invoice.paid", "since": SINCE, "until": UNTIL}
    holder = await asyncpg.connect(admin_settings.database_url)
    try:
        async with running_ingress(admin_settings, load_sources(None)) as client:
            replay = await EventReplayStore(holder).prepare(parse_filter(asked), Actor.cli())
            async with holder.transaction():  # a runner stuck in the middle of an item
                await holder.execute("SELECT FROM event_replays WHERE id = $1 FOR UPDATE", replay.id)
                busy = await client.post(f"/admin/events/replay/{replay.id}/cancel", headers=auth)
                assert (busy.status, (await busy.json())["error"], busy.headers["Retry-After"]) == (
                    503,
                    "run_busy",
                    "5",
                )
                resumed = await client.post(f"/admin/events/replay/{replay.id}/resume", json={}, headers=auth)
                assert (resumed.status, (await resumed.json())["error"]) == (409, "not_waiting")
            assert (await EventReplayStore(holder).get(replay.id)).state == "prepared"
            cancelled = await client.post(f"/admin/events/replay/{replay.id}/cancel", headers=auth)
            assert (cancelled.status, (await cancelled.json())["state"]) == (200, "cancelled")
    finally:
        await holder.close()
    assert await queued_events(admin_settings.amqp_url, admin_settings.namespace) == []


# -- the console: the Events page's search, counted and frozen, confirmed, watched, cancelled ----------


async def test_the_console_replays_an_events_search_after_showing_its_frozen_count(admin_settings, window):
    async with running_ingress(admin_settings, load_sources(None)) as client:
        login = await (await client.get("/console/login")).text()
        await client.post("/console/login", data={"csrf_token": csrf_of(login), "token": TOKEN})
        search = {"source": "stripe", "type": "invoice.paid", "since": SINCE, "until": UNTIL}
        page = await (await client.get("/console/events", params=search)).text()
        assert 'action="/console/event-replays"' in page  # the search's own Replay button, its filter hidden
        form = dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)">', page))
        assert {name: html.unescape(form[name]) for name in search} == search

        prepared = await client.post("/console/event-replays", data=form)
        text = await prepared.text()
        assert prepared.status == 200 and "<strong>2</strong> events match, frozen now" in text, text[-1500:]
        replay_path = prepared.url.path
        await seed_archive(admin_settings.database_url, [archived_event("stripe", "evt_8", at(25), "invoice.paid")])
        await client.post(f"{replay_path}/start", data={"csrf_token": form["csrf_token"], "rate": "1000"})

        async def done() -> bool:
            return "State: <strong>done</strong>" in await (await client.get(replay_path)).text()

        await wait_until(done, 10, message="the replay done")
        progress = await (await client.get(replay_path, headers={"HX-Request": "true"})).text()
        assert "2 of 2 published, 0 skipped" in progress and "<h1>" not in progress
        replay_id = int(replay_path.rsplit("/", 1)[1])
        keys = [e.key for e in await queued_events(admin_settings.amqp_url, admin_settings.namespace)]
        assert keys == [f"replay-{replay_id}/stripe:evt_1", f"replay-{replay_id}/stripe:evt_2"]  # not evt_8

        bad = await client.post("/console/event-replays", data={"csrf_token": form["csrf_token"], "since": "soon"})
        assert bad.status == 400 and "is not valid" in await bad.text()
        nothing = await client.post("/console/event-replays", data={"csrf_token": form["csrf_token"], "source": "x"})
        assert "nothing to do" in await nothing.text()

        waiting = await client.post("/console/event-replays", data=form)
        waiting_path = waiting.url.path
        cancelled = await client.post(f"{waiting_path}/cancel", data={"csrf_token": form["csrf_token"]})
        assert "Cancelled: what was published stays published." in await cancelled.text()
        assert "State: <strong>cancelled</strong>" in await cancelled.text()
        assert (await client.get("/console/event-replays/999999")).status == 404
        audit = await (await client.get("/console/audit")).text()
        assert f'<a href="/console/event-replays/{replay_id}">replay {replay_id}</a>: 2 events)' in audit
        assert f'<a href="/console/event-replays/{replay_id}">replay {replay_id}</a>: 2 published, done)' in audit

        connection = await asyncpg.connect(admin_settings.database_url)
        try:  # replay R's run of evt_1 completed (as a worker's completion row says)
            await connection.execute(
                "INSERT INTO processed_events (key, source, event_id, payload_sha256, attempts)"
                " VALUES ($1, 'stripe', 'evt_1', 'x', 1)",
                f"replay-{replay_id}/stripe:evt_1",
            )
        finally:
            await connection.close()
        event_page = await (await client.get("/console/events/stripe:evt_1")).text()
        assert f'<td><a href="/console/event-replays/{replay_id}">{replay_id}</a></td>' in event_page
        assert "<td>completed " in event_page and "Never replayed." not in event_page
        untouched = await (await client.get("/console/events/stripe:evt_0")).text()
        assert "Never replayed." in untouched and "Replays by selection" not in untouched

        dead_run = replayed_message(
            await _arrival(admin_settings, "stripe:evt_2"), replay_id
        )  # its run failed for good
        connection = await asyncpg.connect(admin_settings.database_url)
        try:
            dead_letter = await record_dead_letter(connection, dead_run, [failure(1)])
        finally:
            await connection.close()
        letter = await (await client.get(f"/console/dead-letters/{dead_letter}")).text()
        assert f"<code>replay-{replay_id}/stripe:evt_2</code>" in letter
        assert '<a href="/console/events/stripe:evt_2">its archived event</a>' in letter
        assert f'<a href="/console/event-replays/{replay_id}">replay {replay_id}</a>' in letter


async def _arrival(settings, key: str):
    connection = await asyncpg.connect(settings.database_url)
    try:
        return await connection.fetchrow("SELECT * FROM event_archive WHERE key = $1 ORDER BY received_at LIMIT 1", key)
    finally:
        await connection.close()


async def test_an_event_whose_day_was_dropped_is_skipped_and_a_stalled_run_may_be_resumed(settings, window):
    connection = await asyncpg.connect(settings.database_url)
    try:
        store = EventReplayStore(connection)
        replay = await store.prepare(stripe_paid(), Actor.cli())
        await connection.execute("DELETE FROM event_archive WHERE key = 'stripe:evt_1'")  # as a dropped day would
        claimed = await store.claim(replay.id, 1000)
        assert claimed is not None and await store.claim(replay.id, 1000) is None  # one runner at a time
        await connection.execute(
            "UPDATE event_replays SET stepped_at = now() - interval '1 minute' WHERE id = $1", replay.id
        )  # its process died mid-run
        claimed = await store.claim(replay.id, 1000)
        assert claimed is not None and claimed.state == "running"
    finally:
        await connection.close()
    result = await asyncio.to_thread(events, "replay", "--resume", str(replay.id), "--json")
    assert result.exit_code == 2 and "is running: not waiting to run" in result.stderr  # a live runner holds it
    await _stale(settings, replay.id)
    result = await asyncio.to_thread(events, "replay", "--resume", str(replay.id), "--json")
    assert result.exit_code == 0, result.stderr
    document = json.loads(result.stdout)
    assert (document["state"], document["published"], document["skipped"]) == ("done", 1, 1)
    queued = await queued_events(settings.amqp_url, settings.namespace)
    assert [e.key for e in queued] == [f"replay-{replay.id}/stripe:evt_2"]


async def _stale(settings, replay_id: int) -> None:
    connection = await asyncpg.connect(settings.database_url)
    try:
        await connection.execute(
            "UPDATE event_replays SET stepped_at = now() - interval '1 minute' WHERE id = $1", replay_id
        )
    finally:
        await connection.close()


# A Cancel behind an ingress runner whose item outlasts its hold of the run
# (docs/reference.md §8, the cancel route: "nothing is [published] after it
# returns"). The runner's held session sits idle in its transaction while the
# item is acted on: past run_locks.HOLD_SECONDS the server ends it, its lock
# goes, and a Cancel waiting for it returns. The item's archived arrival is
# read on that held session, so a runner whose read came after that fails it
# and publishes nothing (read on another pooled connection, as before, it was
# answered and published after the Cancel returned). Real Postgres and
# RabbitMQ; the slow read is a wait before it (a retention drop or a migration
# holding the day, a busy pool).

HOLD_SECONDS = 1.0  # the server's limit on the runner's held session, short for a fast test


@contextlib.asynccontextmanager
async def _a_runner_reading_slowly(settings, monkeypatch) -> AsyncIterator[tuple[SlowArrivalRead, int, asyncio.Task]]:
    """A runner of a replay of one archived event, on a pool as the
    ingress's, once it has marked item 1 in flight and waits on its slow
    read: its store, the replay's id, the runner's task."""
    monkeypatch.setattr(run_locks, "HOLD_SECONDS", HOLD_SECONDS)
    await seed_archive(settings.database_url, [archived_event("stripe", "evt_1", minutes_ago(10), "invoice.paid")])
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=3)  # as the ingress's
    try:
        store = SlowArrivalRead(pool)
        claimed = await claimed_replay(store, "stripe")
        async with confirm_channel(settings) as channel:
            runner = asyncio.create_task(run(replay_job(claimed, store, channel, settings.namespace)))
            await asyncio.wait_for(store.reading.wait(), 10)  # item 1 marked in flight, its read slow
            yield store, claimed.id, runner
    finally:
        await pool.close()


async def test_nothing_is_published_after_a_cancel_behind_a_runner_whose_arrival_read_outlasts_its_hold(
    settings, monkeypatch
):
    async with _a_runner_reading_slowly(settings, monkeypatch) as (store, replay_id, runner):
        assert await store.cancel(replay_id)  # returns once the runner's held session is ended
        cancelled = await store.get(replay_id)
        queued_when_cancelled = await queued_events(settings.amqp_url, settings.namespace)
        store.answered.set()
        await asyncio.wait_for(runner, 15)
    queued_after = await queued_events(settings.amqp_url, settings.namespace)
    assert cancelled is not None
    assert (cancelled.state, cancelled.published, cancelled.in_doubt) == ("cancelled", 1, 1)  # an upper bound
    assert queued_when_cancelled == []
    assert [event.key for event in queued_after] == []  # nothing published after the Cancel returned


async def test_a_run_whose_held_session_the_server_ended_fails_naming_that(settings, monkeypatch):
    async with _a_runner_reading_slowly(settings, monkeypatch) as (store, replay_id, runner):
        await asyncio.sleep(HOLD_SECONDS * 2)  # past the hold: the server ends the held session
        store.answered.set()
        assert await asyncio.wait_for(runner, 15) == "failed"
        failed = await store.get(replay_id)
    assert failed is not None and failed.error is not None
    assert failed.error.startswith("SessionLost: the run's Postgres session ended mid-item"), failed.error


# A runner frozen (a suspended VM, a CLI stopped by Ctrl-Z) longer than a
# day while its replay was cancelled: the archive's upkeep pruned the items
# it had still to read (docs/design.md, "Replay items pruned": an ended
# replay's items go once their events left the archive, a day after its
# end). Waking, it found no item left and ended its run `done`: nothing
# published and the replay's row untouched (finish_event_replay is the
# running runner's only), but its `events_replay` audit entry said `done` of
# a replay cancelled a day before. Now it holds its run once more before it
# ends `done`, and ends `cancelled`. Real Postgres (attacker review of
# 2a0ce2d).


@pytest.fixture
async def connection(database):
    connection = await asyncpg.connect(database)
    yield connection
    await connection.close()


def _never_asked():
    raise AssertionError("nothing is published")


async def test_a_runner_that_wakes_after_its_cancelled_replay_was_pruned_ends_cancelled_not_done(database, connection):
    await seed_archive(database, [archived_event("acme", f"old_{n}", YESTERDAY + timedelta(seconds=n)) for n in (1, 2)])
    store = EventReplayStore(connection)
    claimed = await claimed_replay(store, "acme")
    job = replay_job(claimed, store, None, "ns")
    job._channel = _never_asked  # the runner froze before its next page of items
    # Meanwhile: cancelled, two days ago; its events' day dropped; the upkeep pruned its items.
    assert await store.cancel(claimed.id, Actor.cli())
    await connection.execute(
        "UPDATE event_replays SET finished_at = now() - interval '2 days' WHERE id = $1", claimed.id
    )
    await ArchiveStore(connection).keep({"acme": timedelta(days=7)}, now=A_WEEK_ON)
    assert await ArchiveUpkeep(ArchiveStore(connection), SOURCES).prune() == 2

    ended = await paced_runs.run(job)  # it wakes up

    replay = await store.get(claimed.id)
    entry = await connection.fetchval("SELECT detail FROM audit_log WHERE action = 'events_replay'")
    assert (replay.state, replay.published, replay.handled) == ("cancelled", 0, 0)  # untouched
    assert (ended, json.loads(entry)["state"]) == ("cancelled", "cancelled")


# What on-call is told of a replay cancelled behind a runner that died
# mid-publish (docs/reference.md §8, "Replaying archived events"): the admin
# API's answer, the console's page, `events replay --show` and the audit log
# each say that the event counted published may not have gone out. Real
# Postgres and RabbitMQ; the runner's death is its session's end.

IN_DOUBT_TOKEN = "s3cret-admin-token-of-the-in-doubt-tests"


@pytest.fixture
def in_doubt_settings(settings, monkeypatch) -> Settings:
    monkeypatch.setenv("WEBHOOK_INGEST_ADMIN_TOKEN", IN_DOUBT_TOKEN)
    return Settings()


async def _a_runner_died_after_its_first_publish(settings: Settings) -> int:
    start = minutes_ago(10)
    await seed_archive(
        settings.database_url,
        [archived_event("stripe", f"evt_{n}", start + timedelta(seconds=n), "invoice.paid") for n in (1, 2)],
    )
    connection = await asyncpg.connect(settings.database_url)
    try:
        dying = DiesAfterItsFirstPublish(connection)  # its step is lost with its session, its mark is not
        claimed = await claimed_replay(dying, "stripe")
        async with confirm_channel(settings) as channel:
            await run(replay_job(claimed, dying, channel, settings.namespace))
    finally:
        connection.terminate()
    return claimed.id


async def test_a_cancel_behind_a_dead_runner_says_in_doubt_everywhere(in_doubt_settings):
    replay_id = await _a_runner_died_after_its_first_publish(in_doubt_settings)
    auth = {"Authorization": f"Bearer {IN_DOUBT_TOKEN}"}
    async with running_ingress(in_doubt_settings, load_sources(None)) as client:
        cancelled = await client.post(f"/admin/events/replay/{replay_id}/cancel", headers=auth)
        assert cancelled.status == 200
        answer = await cancelled.json()
        await console_login(client, IN_DOUBT_TOKEN)
        page = await (await client.get(f"/console/event-replays/{replay_id}")).text()
    shown = await asyncio.to_thread(CliRunner().invoke, main, ["events", "replay", "--show", str(replay_id)])
    connection = await asyncpg.connect(in_doubt_settings.database_url)
    try:
        audit = await connection.fetch("SELECT via, detail FROM audit_log WHERE action = 'events_replay_cancelled'")
    finally:
        await connection.close()
    assert len(await queued_events(in_doubt_settings.amqp_url, in_doubt_settings.namespace)) == 1
    assert (answer["state"], answer["handled"], answer["published"], answer["in_doubt"]) == ("cancelled", 1, 1, 1)
    assert "In doubt:" in page and "may not have gone out" in page
    assert shown.exit_code == 0, shown.stderr
    assert "1 published, 1 of them in doubt" in shown.stdout and "may not have gone out" in shown.stdout
    assert [(row["via"], json.loads(row["detail"])["in_doubt"]) for row in audit] == [("admin-api", 1)]


# The frozen selections of ended replays, pruned by the archive's upkeep
# (docs/reference.md §8, "Replaying archived events"; docs/design.md, "Replay
# items pruned"): an item of a `done` or `cancelled` replay goes once
# no arrival of its event is archived (its event's page is gone) and the
# replay ended a day ago; a replay that can still run keeps every item, and
# what a replay's page and an event's page show is unchanged. Real Postgres.

TODAY = MIDNIGHT + timedelta(milliseconds=10)  # a day still kept
RETENTION = {"acme": timedelta(days=7)}

# Each replay's state, and how long ago it ended (None: it has not).
REPLAYS = {
    "done": ("done", timedelta(days=2)),
    "cancelled": ("cancelled", timedelta(days=2)),
    "done_lately": ("done", timedelta(hours=1)),
    "running": ("running", None),
    "stalled": ("running", None),
    "failed": ("failed", None),
    "prepared": ("prepared", None),
}


async def replays_of_a_window(database: str, connection, olds: int = 2) -> dict[str, int]:
    """acme's events old_1.. and `copied` received yesterday (copied again
    today), `new` today; a replay of them in each state of REPLAYS (its
    progress as if run to its end, or half-way), then yesterday dropped."""
    arrivals = [archived_event("acme", f"old_{n}", YESTERDAY + timedelta(seconds=n)) for n in range(1, olds + 1)]
    arrivals += [
        archived_event("acme", "copied", YESTERDAY + timedelta(hours=1)),
        archived_event("acme", "copied", TODAY),
        archived_event("acme", "new", TODAY + timedelta(seconds=1)),
    ]
    await seed_archive(database, arrivals)
    store = EventReplayStore(connection)
    ids = {}
    for name, (state, ended) in REPLAYS.items():
        replay = await store.prepare(parse_filter({"source": "acme"}), Actor.cli())
        assert replay.total == olds + 2
        handled = replay.total if ended else replay.total // 2
        await connection.execute(
            "UPDATE event_replays SET state = $2, next_item = $3 + 1, published = $3 - 1, skipped = 1, rate = 10,"
            " started_at = now() - interval '3 days', stepped_at = now() - $4::interval,"
            " finished_at = now() - $5::interval"
            " WHERE id = $1",
            replay.id,
            state,
            handled,
            timedelta(days=1) if name == "stalled" else timedelta(seconds=1),
            ended,
        )
        ids[name] = replay.id
    await ArchiveStore(connection).keep(RETENTION, now=A_WEEK_ON)
    assert await connection.fetchval("SELECT count(*) FROM event_archive WHERE key LIKE 'acme:old_%'") == 0
    return ids


async def items_of(connection, replay_id: int) -> list[str]:
    return [
        row["key"]
        for row in await connection.fetch(
            "SELECT key FROM event_replay_items WHERE replay_id = $1 ORDER BY item", replay_id
        )
    ]


async def test_an_ended_replays_items_go_once_their_events_left_the_archive_and_nothing_shown_changes(
    database, connection
):
    ids = await replays_of_a_window(database, connection)
    replays, archived = EventReplayStore(connection), ArchiveStore(connection)
    pages = {replay_id: (await replays.get(replay_id)).document() for replay_id in ids.values()}
    listed = {key: await replays.replays_of(key) for key in ("acme:old_1", "acme:copied", "acme:new")}
    everything = ["acme:old_1", "acme:old_2", "acme:copied", "acme:new"]

    assert await ArchiveUpkeep(archived, SOURCES).prune() == 4

    for name, replay_id in ids.items():
        # copied is archived still (today's copy), so its item stays: its page lists the replay
        expected = everything[2:] if name in ("done", "cancelled") else everything
        assert await items_of(connection, replay_id) == expected, name
        assert (await replays.get(replay_id)).document() == pages[replay_id], name  # the replay's page
    assert await replays.replays_of("acme:copied") == listed["acme:copied"]  # its page: every replay, as before
    assert await replays.replays_of("acme:new") == listed["acme:new"]
    assert len(listed["acme:copied"]) == len(ids)
    assert await archived.event("acme:old_1") is None  # no page any more: nothing showed the pruned items
    left = {replay["id"] for replay in await replays.replays_of("acme:old_1")}
    assert left == {ids[name] for name in ids if name not in ("done", "cancelled")}

    assert await ArchiveUpkeep(archived, SOURCES).prune() == 0  # idempotent


async def test_upkeeps_at_once_prune_in_bounded_statements_and_each_item_once(database, connection, monkeypatch):
    monkeypatch.setattr(archive_upkeep, "PRUNE_PAGE", 3)
    monkeypatch.setattr(archive_upkeep, "PRUNE_STATEMENTS", 2)
    ids = await replays_of_a_window(database, connection, olds=20)
    others = [await asyncpg.connect(database) for _ in range(3)]
    try:
        upkeeps = [ArchiveUpkeep(ArchiveStore(other), SOURCES) for other in others]
        rounds: list[list[int]] = []
        while not rounds or any(rounds[-1]):
            rounds.append(await asyncio.gather(*(upkeep.prune() for upkeep in upkeeps)))
            assert all(count <= 3 * 2 for count in rounds[-1])  # a process's round: two statements of three
            assert len(rounds) < 40
    finally:
        for other in others:
            await other.close()
    assert sum(map(sum, rounds)) == 2 * 20  # done's and cancelled's old events, each deleted once
    assert len(rounds) >= 3
    everything = [f"acme:old_{n}" for n in range(1, 21)] + ["acme:copied", "acme:new"]
    for name, replay_id in ids.items():
        expected = everything[20:] if name in ("done", "cancelled") else everything
        assert await items_of(connection, replay_id) == expected, name


async def test_the_upkeep_every_process_runs_prunes_once_its_archive_is_ready(database, connection):
    ids = await replays_of_a_window(database, connection)
    own = await asyncpg.connect(database)
    upkeep = ArchiveUpkeep(ArchiveStore(own), SOURCES)
    task = asyncio.create_task(upkeep.run())
    try:

        async def pruned() -> bool:
            return len(await items_of(connection, ids["cancelled"])) == 2

        await wait_until(pruned, 10, message="the cancelled replay's items pruned by the upkeep's loop")
        assert upkeep.ready.is_set()
        assert await items_of(connection, ids["done"]) == ["acme:copied", "acme:new"]
        assert len(await items_of(connection, ids["running"])) == 4
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await own.close()


# An ended replay's items whose events left the archive, once held back
# by its oldest item's key arriving again and again (attacker review of
# 2a0ce2d). design.md ("Replay items pruned") says the items "last while
# their events are archived"; the upkeep took only replays whose oldest item
# left was gone and stopped at the first still archived, so one key archived
# again on every kept day — a provider resending one event id, a source
# hashing a recurring identical body (`sha256:…` ids: a heartbeat) — kept
# every later item of the replay for ever, events long gone. Now each replay
# is walked in passes (migration 0025): an archived item is skipped, and
# read again by the next pass, a day on at the soonest, so a round reads a
# bounded page whatever is archived. Real Postgres.


async def test_items_whose_events_left_the_archive_go_though_the_replay_s_first_key_arrives_again(database):
    # `heartbeat` first (yesterday, and again today: a key that recurs), then two events of yesterday only
    await seed_archive(
        database,
        [
            archived_event("acme", "heartbeat", YESTERDAY),
            archived_event("acme", "old_1", YESTERDAY + timedelta(seconds=1)),
            archived_event("acme", "old_2", YESTERDAY + timedelta(seconds=2)),
            archived_event("acme", "heartbeat", MIDNIGHT + timedelta(seconds=5)),
        ],
    )
    connection = await asyncpg.connect(database)
    try:
        replay = await EventReplayStore(connection).prepare(parse_filter({"source": "acme"}), Actor.cli())
        assert replay.total == 3
        await connection.execute(
            "UPDATE event_replays SET state = 'done', next_item = 4, published = 3,"
            " finished_at = now() - interval '2 days' WHERE id = $1",
            replay.id,
        )
        await ArchiveStore(connection).keep({"acme": timedelta(days=7)}, now=A_WEEK_ON)
        assert await ArchiveStore(connection).event("acme:old_1") is None  # no page: nothing shows its item
        await ArchiveUpkeep(ArchiveStore(connection), SOURCES).prune()
        left = [
            row["key"]
            for row in await connection.fetch(
                "SELECT key FROM event_replay_items WHERE replay_id = $1 ORDER BY item", replay.id
            )
        ]
    finally:
        await connection.close()
    assert left == ["acme:heartbeat"]


async def ended_replay_of_acme(connection) -> int:
    """A replay of every acme event, done two days ago."""
    replay = await EventReplayStore(connection).prepare(parse_filter({"source": "acme"}), Actor.cli())
    await connection.execute(
        "UPDATE event_replays SET state = 'done', next_item = total + 1, published = total,"
        " finished_at = now() - interval '2 days' WHERE id = $1",
        replay.id,
    )
    return replay.id


async def test_a_pass_skips_archived_items_and_reads_them_again_only_a_day_after_it_began(database):
    # heartbeat recurs (yesterday, today, tomorrow); old_1 yesterday only; mid_1 today only
    await seed_archive(
        database,
        [
            archived_event("acme", "heartbeat", YESTERDAY),
            archived_event("acme", "old_1", YESTERDAY + timedelta(seconds=1)),
            archived_event("acme", "mid_1", MIDNIGHT + timedelta(seconds=1)),
            archived_event("acme", "heartbeat", MIDNIGHT + timedelta(seconds=5)),
            archived_event("acme", "heartbeat", TOMORROW),
        ],
    )
    connection = await asyncpg.connect(database)
    try:
        replay_id = await ended_replay_of_acme(connection)
        replays, upkeep = EventReplayStore(connection), ArchiveUpkeep(ArchiveStore(connection), SOURCES)
        await ArchiveStore(connection).keep({"acme": timedelta(days=7)}, now=A_WEEK_ON)  # yesterday goes
        assert await upkeep.prune() == 1
        assert await items_of(connection, replay_id) == ["acme:heartbeat", "acme:mid_1"]
        assert await replays.to_prune(DAY, 20, DAY) == []  # the pass is over: nothing read a minute on
        assert await upkeep.prune() == 0

        await ArchiveStore(connection).keep({"acme": timedelta(days=7)}, now=A_WEEK_ON + timedelta(days=1))
        assert await ArchiveStore(connection).event("acme:mid_1") is None  # today went too: mid_1 has no page
        assert await upkeep.prune() == 0  # the next pass begins a day after this one began
        assert await items_of(connection, replay_id) == ["acme:heartbeat", "acme:mid_1"]

        await connection.execute(
            "UPDATE event_replay_prune_passes SET pass_started_at = now() - interval '25 hours' WHERE replay_id = $1",
            replay_id,
        )
        assert await replays.to_prune(DAY, 20, DAY) == [replay_id]
        assert await upkeep.prune() == 1
        assert await items_of(connection, replay_id) == ["acme:heartbeat"]  # tomorrow's heartbeat is archived
        assert await replays.to_prune(DAY, 20, DAY) == []
    finally:
        await connection.close()


async def test_a_round_reads_a_bounded_page_of_a_replay_whatever_is_archived(database, monkeypatch):
    monkeypatch.setattr(archive_upkeep, "PRUNE_PAGE", 3)
    monkeypatch.setattr(archive_upkeep, "PRUNE_STATEMENTS", 2)
    # 20 events of today, every one still archived: nothing to delete, and each round reads six items on
    await seed_archive(
        database, [archived_event("acme", f"kept_{n}", MIDNIGHT + timedelta(seconds=n)) for n in range(1, 21)]
    )
    connection = await asyncpg.connect(database)
    try:
        replay_id = await ended_replay_of_acme(connection)
        upkeep = ArchiveUpkeep(ArchiveStore(connection), SOURCES)
        positions = []
        for _ in range(5):
            assert await upkeep.prune() == 0
            positions.append(
                await connection.fetchval(
                    "SELECT next_item FROM event_replay_prune_passes WHERE replay_id = $1", replay_id
                )
            )
        assert positions == [7, 13, 19, 21, 21]
        assert await EventReplayStore(connection).to_prune(DAY, 20, DAY) == []
        assert len(await items_of(connection, replay_id)) == 20
    finally:
        await connection.close()


async def upkeeps_at_once(connection, upkeeps: list[ArchiveUpkeep]) -> int:
    """Rounds of every upkeep at once until no pass has items to read; items deleted."""
    rounds: list[list[int]] = []
    while len(rounds) < 40 and await EventReplayStore(connection).to_prune(DAY, 20, DAY):
        rounds.append(await asyncio.gather(*(upkeep.prune() for upkeep in upkeeps)))
        assert all(count <= 3 * 2 for count in rounds[-1])
    assert len(rounds) < 40
    return sum(map(sum, rounds))


async def test_upkeeps_at_once_share_a_pass_behind_a_recurring_first_key(database, monkeypatch):
    monkeypatch.setattr(archive_upkeep, "PRUNE_PAGE", 3)
    monkeypatch.setattr(archive_upkeep, "PRUNE_STATEMENTS", 2)
    arrivals = [
        archived_event("acme", "heartbeat", YESTERDAY),
        archived_event("acme", "heartbeat", MIDNIGHT),
        archived_event("acme", "heartbeat", TOMORROW),
    ]
    arrivals += [archived_event("acme", f"old_{n}", YESTERDAY + timedelta(seconds=n)) for n in range(1, 31)]
    arrivals += [archived_event("acme", f"kept_{n}", MIDNIGHT + timedelta(seconds=n)) for n in range(1, 11)]
    await seed_archive(database, arrivals)
    connection = await asyncpg.connect(database)
    others = [await asyncpg.connect(database) for _ in range(3)]
    try:
        first, second = await ended_replay_of_acme(connection), await ended_replay_of_acme(connection)
        await ArchiveStore(connection).keep({"acme": timedelta(days=7)}, now=A_WEEK_ON)
        upkeeps = [ArchiveUpkeep(ArchiveStore(other), SOURCES) for other in others]
        assert await upkeeps_at_once(connection, upkeeps) == 2 * 30  # each gone item deleted once
        kept = ["acme:heartbeat"] + [f"acme:kept_{n}" for n in range(1, 11)]
        assert await items_of(connection, first) == kept
        assert await items_of(connection, second) == kept
        assert [await upkeep.prune() for upkeep in upkeeps] == [0, 0, 0]

        # today goes too, and a day on the upkeeps all begin the next passes at once: one pass each, shared
        await ArchiveStore(connection).keep({"acme": timedelta(days=7)}, now=A_WEEK_ON + timedelta(days=1))
        await connection.execute("UPDATE event_replay_prune_passes SET pass_started_at = now() - interval '25 hours'")
        assert await upkeeps_at_once(connection, upkeeps) == 2 * 10
        assert await items_of(connection, first) == await items_of(connection, second) == ["acme:heartbeat"]
        assert (
            await connection.fetchval(
                "SELECT count(*) FROM event_replay_prune_passes WHERE pass_started_at > now() - interval '1 hour'"
            )
            == 2
        )
    finally:
        for other in others:
            await other.close()
        await connection.close()


# Listing the replays to prune when one replay holds every item left
# (attacker review of 15ce0f6). Ended replays whose items are all gone keep
# their pass rows, and are listed no more; but `event_replays_to_prune`
# probes each ended replay's items with EXISTS (replay_id = r.id ...), and
# once the statistics say one replay holds every item left (a big replay
# whose items are still archived, behind many small ones pruned empty: the
# state pruning leads to), the planner reads each probe as a seq scan of
# event_replay_items: 5,120 ended replays and 20,000 items take ~8 s,
# 100,000 items ~85 s, past the statement's PRUNE_SECONDS (10 s): every
# round then timed out and nothing was pruned again. Now the last item
# left is read as max(): one backward probe of the primary key each. Real
# Postgres.


async def test_listing_stays_cheap_when_one_replay_holds_every_item_left(database, monkeypatch):
    monkeypatch.setattr(event_replay_store, "PRUNE_SECONDS", 2.0)
    await seed_archive(database, [archived_event("acme", f"k{n}", MIDNIGHT + timedelta(seconds=n)) for n in range(3)])
    connection = await asyncpg.connect(database)
    try:
        replay = await EventReplayStore(connection).prepare(parse_filter({"source": "acme"}), Actor.cli())
        await connection.execute(
            "UPDATE event_replays SET state = 'done', finished_at = now() - interval '2 days' WHERE id = $1", replay.id
        )
        columns = ", ".join(
            row["column_name"]
            for row in await connection.fetch(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'event_replays'"
                " AND column_name <> 'id'"
            )
        )
        for _ in range(4):
            await connection.execute(f"INSERT INTO event_replays ({columns}) SELECT {columns} FROM event_replays")
        for _ in range(10):  # 5,120 ended replays, their items all gone, each with its pass row over
            await connection.execute(
                f"INSERT INTO event_replays ({columns}) SELECT {columns} FROM event_replays WHERE id <= 1024"
            )
        await connection.execute(
            "INSERT INTO event_replay_prune_passes (replay_id, next_item, pass_started_at)"
            " SELECT id, 20001, now() - interval '2 days' FROM event_replays"
        )
        # the first replay holds every item left, all still archived, its pass over an hour ago
        await connection.execute(
            "INSERT INTO event_replay_items (replay_id, item, source, key, received_at)"
            " SELECT $1, g, 'acme', 'acme:k0', now() FROM generate_series(4, 20000) g",
            replay.id,
        )
        await connection.execute(
            "UPDATE event_replay_prune_passes SET pass_started_at = now() - interval '1 hour' WHERE replay_id = $1",
            replay.id,
        )
        await connection.execute("ANALYZE")
        assert await EventReplayStore(connection).to_prune(DAY, 20, DAY) == []
    finally:
        await connection.close()


# A pruning statement of a pass that is over moves the position of the
# next pass (attacker review of 15ce0f6). Each statement reads the pass row
# in its snapshot and, at its end, moves the position with greatest(); a
# statement that read the last pass's position (items left past it in its
# snapshot) and whose upsert lands after another upkeep began the next pass
# pushes that new pass's position to the old one, past items the new pass
# has not read: those whose events left the archive stay a day more (the
# pass is then over, begun just now). Real Postgres; each statement is held
# at its upsert by a test trigger (a BEFORE INSERT trigger fires before the
# conflict check, so the held statement holds no lock on the pass row).

HOLD = """
CREATE FUNCTION test_hold_pass_upsert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(current_setting('test.hold', true), '') <> '' THEN
        PERFORM pg_advisory_xact_lock(current_setting('test.hold')::bigint);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER test_hold_pass_upsert BEFORE INSERT ON event_replay_prune_passes
    FOR EACH ROW EXECUTE FUNCTION test_hold_pass_upsert();
"""


async def held(connection, pid: int) -> None:
    """Until the backend `pid` waits on an advisory lock."""
    for _ in range(500):
        if await connection.fetchval(
            "SELECT EXISTS (SELECT FROM pg_locks WHERE pid = $1 AND locktype = 'advisory' AND NOT granted)", pid
        ):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"backend {pid} never reached its upsert")


async def test_a_statement_of_the_last_pass_does_not_move_the_next_pass_s_position(database):
    # heartbeat recurs (archived on every day); old_1..old_4 yesterday only: gone once yesterday goes
    await seed_archive(
        database,
        [archived_event("acme", "heartbeat", YESTERDAY)]
        + [archived_event("acme", f"old_{n}", YESTERDAY + timedelta(seconds=n)) for n in range(1, 5)]
        + [archived_event("acme", "heartbeat", MIDNIGHT), archived_event("acme", "heartbeat", TOMORROW)],
    )
    connection = await asyncpg.connect(database)
    x, b, a = [await asyncpg.connect(database) for _ in range(3)]
    try:
        replay = await EventReplayStore(connection).prepare(parse_filter({"source": "acme"}), Actor.cli())
        assert replay.total == 5
        await connection.execute(
            "UPDATE event_replays SET state = 'done', next_item = 6, published = 5,"
            " finished_at = now() - interval '2 days' WHERE id = $1",
            replay.id,
        )
        await ArchiveStore(connection).keep({"acme": timedelta(days=7)}, now=A_WEEK_ON)
        # a pass begun two days ago, at item 4 (it read items 1-3 while old_1 and old_2 were still archived)
        await connection.execute(
            "INSERT INTO event_replay_prune_passes (replay_id, next_item, pass_started_at)"
            " VALUES ($1, 4, now() - interval '2 days')",
            replay.id,
        )
        await connection.execute(HOLD)
        await connection.execute("SELECT pg_advisory_lock(1), pg_advisory_lock(2)")
        await x.execute("SET test.hold = '1'")
        await b.execute("SET test.hold = '2'")

        # X reads items 4 and 5 (gone: deleted) and is held at its upsert, its page locked
        x_prune = asyncio.create_task(EventReplayStore(x).prune(replay.id, DAY, 10, DAY))
        await held(connection, x.get_server_pid())
        # B read the pass at item 4 too, items 4 and 5 locked by X: its page is empty, position 4
        b_prune = asyncio.create_task(EventReplayStore(b).prune(replay.id, DAY, 10, DAY))
        await held(connection, b.get_server_pid())
        await connection.execute("SELECT pg_advisory_unlock(1)")
        assert await x_prune == (2, False)  # the pass is over, begun two days ago
        # A begins the next pass at the first item left: heartbeat, still archived
        assert await EventReplayStore(a).prune(replay.id, DAY, 1, DAY) == (0, True)
        assert (
            await connection.fetchval("SELECT next_item FROM event_replay_prune_passes WHERE replay_id = $1", replay.id)
            == 2
        )
        await connection.execute("SELECT pg_advisory_unlock(2)")
        assert await b_prune == (0, False)
        # the new pass goes on from item 2: old_1 and old_2 have no page, and go at the next round
        assert (
            await connection.fetchval("SELECT next_item FROM event_replay_prune_passes WHERE replay_id = $1", replay.id)
            == 2
        )
        await ArchiveUpkeep(ArchiveStore(connection), SOURCES).prune()
        left = [
            row["key"]
            for row in await connection.fetch(
                "SELECT key FROM event_replay_items WHERE replay_id = $1 ORDER BY item", replay.id
            )
        ]
        assert left == ["acme:heartbeat"]
    finally:
        for other in (x, b, a):
            await other.close()
        await connection.close()


ROUTED_ORDERED = """
[sources.routed]
scheme = "hmac-sha256"
secrets = ["s"]

[[sources.routed.routes]]
name = "billing"
handler = "inbox"
ordering = { key = "body:object" }

[[sources.routed.routes]]
name = "audit"
handler = "inbox"
"""


async def test_a_replay_of_a_routed_event_leaves_its_ordered_routes_to_their_lanes(settings, tmp_path):
    """The ingress writes the ordered route's row and publishes one message
    naming it (`x-laned-routes`), so the fan-out skips it (A's interfaces,
    item 1, asked the same of replays by selection). EventReplayStore.publish
    inserts the row for `billing` and publishes the replayed message as it is:
    the worker fans it out to `billing` as well, whose run (the same key,
    replay-R/KEY#billing) then races the lane — past a block, a hold or
    earlier rows of the live stream — and the lane's row is the duplicate."""
    path = tmp_path / "sources.toml"
    path.write_text(ROUTED_ORDERED)
    sources = load_sources(str(path))
    arrival = archived_event("routed", "evt_r1", at(30), "invoice.paid", object="o1")
    await seed_archive(settings.database_url, [arrival])
    item = ReplayItem(1, "routed", arrival.key, datetime.fromtimestamp(arrival.received_at, UTC))
    broker = await aio_pika.connect(settings.amqp_url)
    async with broker:
        channel = await broker.channel(publisher_confirms=True)
        await topology.declare_events_queue(channel, settings.namespace, settings.delivery_limit)
        connection = await asyncpg.connect(settings.database_url)
        try:
            assert await EventReplayStore(connection).publish(channel, settings.namespace, 7, item, sources=sources)
        finally:
            await connection.close()
    lanes = await fetch_all(settings.database_url, "SELECT lane, key FROM ordered_events")
    assert [(row["lane"], row["key"]) for row in lanes] == [("routed#billing:o1", "replay-7/routed:evt_r1#billing")]
    [published] = await queued_events(settings.amqp_url, settings.namespace)
    fanned_out = [message.route for message in route_messages(sources["routed"], published)]
    assert fanned_out == ["audit"], fanned_out


async def fetch_all(database_url: str, sql: str) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetch(sql)
    finally:
        await connection.close()
