"""Replaying archived events (docs/reference.md §8, "Replaying archived
events"): a replay by filter and window runs each event's handler exactly
once per replay (issue 22, item 5) with real worker processes: one SIGKILLed
halfway through a replay of 1,000 archived events, a second replay of the
same window, and copies of one replay's messages. The handler waits ~100 ms,
as real ones do (tests/support/replay_handlers.py).

Then the paced run against the real admin API: an unknown filter name or a
rate too small to finish is refused; what a Cancel reports published is all
that is ever published (mid-item, behind a runner that died, from the
previous release); a runner taken over or stalled stops; the console offers
Resume for a replay whose process died. The takeover with a stopped process:
test_event_replay_takeover.py; the console's pages: test_console_event_replays.py."""

import asyncio
import contextlib
import json
import re
from datetime import UTC, datetime, timedelta

import asyncpg
import pytest
from click.testing import CliRunner

from tests.support.archive import archived_event, minutes_ago, seed_archive
from tests.support.event_replays import claimed_replay, replay_job
from tests.support.events import publish_events, queue_depth
from tests.support.exactly_once import effects_by_key, write_sources
from tests.support.ingress import console_login, queued_events, running_ingress
from tests.support.processes import count_rows, wait_for_output, wait_until
from tests.support.replay_handlers import REPLAY_RUNS_TABLE
from tests.support.tcpproxy import free_port
from webhook_ingest.cli.dlq import confirm_channel
from webhook_ingest.cli.main import main
from webhook_ingest.shared.archive.search import parse_filter
from webhook_ingest.shared.audit.actor import Actor
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.replays.model import replayed_message
from webhook_ingest.shared.replays.store import EventReplayJob, EventReplayStore
from webhook_ingest.shared.runs import locks as run_locks
from webhook_ingest.shared.runs.paced import run
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources

EVENTS = 1000


@pytest.fixture
def window_start() -> datetime:
    """When the window's first event was received: the replays' bounds are fixed from it, not from
    the clock at each replay (a slow run must not slide the window past its oldest events)."""
    return minutes_ago(30)


@pytest.fixture
async def window(settings, window_start):
    """1,000 archived acme events received 30 to 20 minutes ago, and one outside."""
    start = window_start
    arrivals = [
        archived_event("acme", f"evt_{n}", start + timedelta(seconds=0.6 * n), "invoice.paid") for n in range(EVENTS)
    ]
    await seed_archive(settings.database_url, [*arrivals, archived_event("acme", "old", minutes_ago(90))])
    connection = await asyncpg.connect(settings.database_url)
    try:
        await connection.execute(REPLAY_RUNS_TABLE)
    finally:
        await connection.close()
    return [arrival.key for arrival in arrivals]


def replay_window(start: datetime, *more: str) -> dict:
    """`events replay` of the window's 1,000 events, from a minute before the first to a minute after the last."""
    since, until = (start - timedelta(minutes=1)).isoformat(), (start + timedelta(minutes=11)).isoformat()
    result = CliRunner().invoke(
        main,
        [
            "events",
            "replay",
            "--source",
            "acme",
            "--since",
            since,
            "--until",
            until,
            "--yes",
            "--rate",
            "1000",
            "--json",
            *more,
        ],
    )
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.usefixtures("effects_tables")
async def test_a_replay_of_1000_events_with_a_worker_killed_halfway_runs_each_once_per_replay(
    settings, fleet, tmp_path, window, window_start
):
    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", "tests.support.replay_handlers:recorded")}
    victim = fleet.worker("--concurrency", "32", env=env)
    fleet.worker("--concurrency", "32", env=env)
    await wait_for_output(victim, "worker_consuming")

    replaying = asyncio.create_task(
        asyncio.to_thread(replay_window, window_start)
    )  # the CLI, publishing as the workers run
    await _until_completed(settings, EVENTS // 2)
    victim.kill()
    assert await count_rows(settings.database_url, "processed_events") < EVENTS  # killed mid-replay
    fleet.worker("--concurrency", "32", env=env)
    first = await replaying
    assert (first["state"], first["total"], first["published"]) == ("done", EVENTS, EVENTS)
    await _until_settled(settings, EVENTS)
    runs = await effects_by_key(settings.database_url)
    assert runs == {f"replay-{first['id']}/{key}": 1 for key in window}  # each once; none of the event's own key

    second = await asyncio.to_thread(replay_window, window_start)
    assert second["id"] != first["id"] and second["total"] == EVENTS
    await _until_settled(settings, 2 * EVENTS)
    runs = await effects_by_key(settings.database_url)
    assert runs == {f"replay-{replay['id']}/{key}": 1 for replay in (first, second) for key in window}
    told = await _replay_runs(settings)
    assert told == {(key, replay["id"]) for replay in (first, second) for key in window}  # event.replay said which


@pytest.mark.usefixtures("effects_tables")
@pytest.mark.parametrize("redis", ["redis", "redis-unreachable"])
async def test_copies_of_a_replays_messages_run_each_event_once(settings, fleet, tmp_path, window, redis):
    """As a runner that died between its publish and its progress leaves them,
    or a broker's redelivery: three copies of each of 100 replayed events at
    once, on two workers — also without Redis (its locks lost: Postgres alone)."""
    keys = window[:100]
    connection = await asyncpg.connect(settings.database_url)
    try:
        store = EventReplayStore(connection)
        replay = await store.prepare(parse_filter({"source": "acme", "key": "acme:evt_1"}), Actor.cli())
        arrivals = [await connection.fetchrow("SELECT * FROM event_archive WHERE key = $1", key) for key in keys]
    finally:
        await connection.close()
    messages = [replayed_message(arrival, replay.id) for arrival in arrivals]
    env = {
        "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", "tests.support.replay_handlers:recorded"),
        **({"REDIS_URLS": f"redis://127.0.0.1:{free_port()}/0"} if redis == "redis-unreachable" else {}),
    }
    workers = [fleet.worker("--concurrency", "32", env=env) for _ in range(2)]
    for worker in workers:  # both racing: one started first could take every copy alone
        await wait_for_output(worker, "worker_consuming")
    await publish_events(settings.amqp_url, settings.namespace, [m for m in messages for _ in range(3)])
    await _until_settled(settings, len(keys))
    assert await effects_by_key(settings.database_url) == {f"replay-{replay.id}/{key}": 1 for key in keys}
    if redis == "redis-unreachable":
        assert all("idempotency_store_degraded" in worker.output() for worker in workers)


async def _until_completed(settings, count: int) -> None:
    async def done() -> bool:
        return await count_rows(settings.database_url, "processed_events") >= count

    await wait_until(done, 60, message=f"{count} completions")


async def _until_settled(settings, count: int) -> None:
    """`count` completions, the queues empty, and a second more for any copy a kill left to come back."""
    await _until_completed(settings, count)
    queues = [topology.events_queue(settings.namespace), topology.retry_queue(settings.namespace, 1.0)]

    async def drained() -> bool:
        return all([await queue_depth(settings.amqp_url, name) == 0 for name in queues])

    await wait_until(drained, 30, message="empty events and deferral queues")
    await asyncio.sleep(1.5)


async def _replay_runs(settings) -> set[tuple[str, int]]:
    connection = await asyncpg.connect(settings.database_url)
    try:
        rows = await connection.fetch("SELECT key, event_key, events_replay FROM replay_runs")
    finally:
        await connection.close()
    for row in rows:
        assert row["key"] == f"replay-{row['events_replay']}/{row['event_key']}"
    return {(row["event_key"], row["events_replay"]) for row in rows}


@pytest.mark.usefixtures("effects_tables")
async def test_a_replay_of_a_routed_sources_events_runs_every_route_once(settings, fleet, tmp_path, window):
    """A source with two routes: the replay's message is fanned out by the
    worker like the event was, each (event, route) once under replay-R/KEY#ROUTE."""
    sources = tmp_path / "routes.toml"
    sources.write_text(
        '[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["s"]\n'
        '[[sources.acme.routes]]\nname = "billing"\nhandler = "tests.support.replay_handlers:recorded"\n'
        'types = ["invoice.*"]\n'
        '[[sources.acme.routes]]\nname = "crm"\nhandler = "tests.support.replay_handlers:recorded"\n'
    )
    for _ in range(2):
        fleet.worker("--concurrency", "32", env={"WEBHOOK_INGEST_SOURCES": str(sources)})
    keys = window[:50]
    connection = await asyncpg.connect(settings.database_url)
    try:
        replay = await EventReplayStore(connection).prepare(
            parse_filter({"source": "acme", "key": "acme:evt_1"}), Actor.cli()
        )
        arrivals = [await connection.fetchrow("SELECT * FROM event_archive WHERE key = $1", key) for key in keys]
    finally:
        await connection.close()
    await publish_events(
        settings.amqp_url,
        settings.namespace,
        [replayed_message(arrival, replay.id) for arrival in arrivals for _ in range(2)],
    )
    await _until_settled(settings, 2 * len(keys))
    assert await effects_by_key(settings.database_url) == {
        f"replay-{replay.id}/{key}#{route}": 1 for key in keys for route in ("billing", "crm")
    }
    told = await _replay_runs(settings)
    assert told == {(f"{key}#{route}", replay.id) for key in keys for route in ("billing", "crm")}


TOKEN = "s3cret-admin-token-of-the-replay-adversary"


AN_HOUR_AGO = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)


@pytest.fixture
def admin_settings(settings, monkeypatch) -> Settings:
    monkeypatch.setenv("WEBHOOK_INGEST_ADMIN_TOKEN", TOKEN)
    return Settings()


async def _seed_invoices(database_url: str, count: int) -> None:
    """stripe's evt_1 to evt_`count`, invoice.paid, a second apart, an hour ago."""
    await seed_archive(
        database_url,
        [
            archived_event("stripe", f"evt_{n}", AN_HOUR_AGO + timedelta(seconds=n), "invoice.paid")
            for n in range(1, count + 1)
        ],
    )


async def _replays(database_url: str) -> list:
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetch("SELECT id, total, state FROM event_replays")
    finally:
        await connection.close()


async def _waits_for_a_lock(database_url: str, query: str) -> bool:
    """Whether a session of this database runs `query` and waits for a lock."""
    other = await asyncpg.connect(database_url)
    try:
        return (
            await other.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database() AND query = $1",
                query,
            )
            > 0
        )
    finally:
        await other.close()


class _CancelledMidItem(EventReplayStore):
    """The store, with a Cancel from elsewhere (another connection: the
    console, `--cancel`) arriving after the runner read `running` and before
    its publish: what the Cancel reported is kept in `seen`."""

    def __init__(self, connection, database_url: str):
        super().__init__(connection)
        self._database_url, self.seen = database_url, None
        self.cancelling: asyncio.Task | None = None

    async def publish(self, channel, namespace, replay_id, item, held=None, sources=None, woken=None):
        cancelling = self.cancelling = asyncio.create_task(self._cancel(replay_id))
        await wait_until(lambda: self._settled(cancelling), 10, message="the cancel answered or waits")
        published = await super().publish(channel, namespace, replay_id, item, held, sources, woken)
        return published

    async def _settled(self, cancelling: asyncio.Task) -> bool:
        return cancelling.done() or await _waits_for_a_lock(self._database_url, run_locks.WAIT_FOR_RUN)

    async def _cancel(self, replay_id: int) -> None:
        other = await asyncpg.connect(self._database_url)
        try:
            store = EventReplayStore(other)
            assert await store.cancel(replay_id)
            self.seen = await store.get(replay_id)
        finally:
            await other.close()


class _DiesAfterPublishing(_CancelledMidItem):
    """The store of a runner whose process dies (SIGKILL; or Postgres cut
    from it) once its publish was confirmed, before its step commits, while
    a Cancel from elsewhere waits for the run's row."""

    async def publish(self, channel, namespace, replay_id, item, held=None, sources=None, woken=None):
        published = await EventReplayStore.publish(self, channel, namespace, replay_id, item, held, sources, woken)
        cancelling = self.cancelling = asyncio.create_task(self._cancel(replay_id))
        await wait_until(lambda: self._settled(cancelling), 10, message="the cancel waits")
        self._database.terminate()  # its session ends, its transaction (and the row's lock) with it
        return published


class _Stalling(EventReplayStore):
    """The store of a runner that stalls (a CLI suspended by Ctrl-Z, a
    process cut from Postgres) until `go` is set: before it holds its run's
    row for its first item (`in_publish` False), or holding it, in its first
    publish (`in_publish` True)."""

    def __init__(self, connection, in_publish: bool):
        super().__init__(connection)
        self.stalled, self.go, self._in_publish = asyncio.Event(), asyncio.Event(), in_publish

    async def _stall(self) -> None:
        if not self.go.is_set():
            self.stalled.set()
            await self.go.wait()

    @contextlib.asynccontextmanager
    async def held(self, replay_id, stepped_at):
        if not self._in_publish:
            await self._stall()
        async with super().held(replay_id, stepped_at) as held:
            yield held

    async def publish(self, channel, namespace, replay_id, item, held=None, sources=None, woken=None):
        if self._in_publish:
            await self._stall()
        return await super().publish(channel, namespace, replay_id, item, held, sources, woken)


async def _taken_over_while_stalled(settings, in_publish: bool) -> tuple[list, list, object]:
    """Three events; a runner stalls (`_Stalling`), its run is taken over by
    a Resume elsewhere and run to the end, then the stalled runner wakes.
    The audit's end states, the keys queued, the replay as it ended."""
    await _seed_invoices(settings.database_url, 3)
    first, second = await asyncpg.connect(settings.database_url), await asyncpg.connect(settings.database_url)
    try:
        stalling = _Stalling(first, in_publish)
        replay = await claimed_replay(stalling, "stripe")
        async with confirm_channel(settings) as channel:
            job = replay_job(replay, stalling, channel, settings.namespace)
            stalled_run = asyncio.create_task(run(job))
            await asyncio.wait_for(stalling.stalled.wait(), 10)
            await second.execute(
                "UPDATE event_replays SET stepped_at = now() - interval '1 minute' WHERE id = $1", replay.id
            )  # as 30 s + 2/rate without a step would
            taker = EventReplayStore(second)
            taken = await taker.claim(replay.id, 1000)  # the console's Resume
            assert taken is not None
            assert await run(replay_job(taken, taker, channel, settings.namespace)) == "done"
            stalling.go.set()
            await asyncio.wait_for(stalled_run, 10)
        audit = await second.fetch("SELECT action, detail FROM audit_log ORDER BY id")
        finished = await taker.get(replay.id)
    finally:
        await first.close()
        await second.close()
    ends = [json.loads(row["detail"])["state"] for row in audit if row["action"] == "events_replay"]
    keys = sorted(event.key for event in await queued_events(settings.amqp_url, settings.namespace))
    return ends, keys, finished


PREVIOUS_RELEASE_CANCEL = (
    "UPDATE event_replays SET state = 'cancelled', finished_at = now() "
    "WHERE id = $1 AND state IN ('prepared', 'running', 'failed') RETURNING id"
)


class _CancelledByThePreviousRelease(EventReplayJob):
    """A runner of this release whose replay a process of the previous one
    (an upgrade rolling out) cancels while it holds an item: the previous
    release's Cancel (its cancel_event_replay, verbatim as of 7395cf8) waits
    on the replay's row lock alone, not on the run's advisory lock."""

    def __init__(self, *args, database_url: str, **kwargs):
        super().__init__(*args, **kwargs)
        self._database_url, self.seen, self.cancelling = database_url, None, None

    async def in_flight(self, item):
        if self.cancelling is None:
            self.cancelling = asyncio.create_task(self._cancel())
            await wait_until(self._waiting, 10, message="the previous release's cancel waits for the row")
        await super().in_flight(item)

    async def _waiting(self) -> bool:
        return await _waits_for_a_lock(self._database_url, PREVIOUS_RELEASE_CANCEL)

    async def _cancel(self) -> None:
        other = await asyncpg.connect(self._database_url)
        try:
            assert await other.fetchval(PREVIOUS_RELEASE_CANCEL, self.id) == self.id
            self.seen = await EventReplayStore(other).get(self.id)
        finally:
            await other.close()


@pytest.mark.parametrize(
    "asked",
    [
        {"event_type": "invoice.paid"},  # the filter's name in the CLI (--type) and the Python API; the API says "type"
        {"sorce": "stripe"},  # a typo
        {"source": ""},  # a script's unset variable
        {"filter": {"source": "stripe"}},  # the filter nested, as the replay's own document shows it
    ],
)
async def test_a_replay_asked_with_a_filter_name_it_does_not_know_is_refused_not_run_over_everything(
    admin_settings, asked
):
    """R1: a name POST /admin/events/replay does not know was dropped (an
    empty value too), so the filter meant to narrow the replay narrowed
    nothing: {'event_type': 'invoice.paid', 'dry_run': true} counted 2
    (stripe's and github's), and without dry_run every archived event of
    every source was frozen and started. Now a 400, nothing frozen."""
    await seed_archive(
        admin_settings.database_url,
        [
            archived_event("stripe", "evt_1", AN_HOUR_AGO, "invoice.paid"),
            archived_event("github", "d-1", AN_HOUR_AGO, "push"),
        ],
    )
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with running_ingress(admin_settings, load_sources(None)) as client:
        dry = await client.post("/admin/events/replay", json=asked | {"dry_run": True}, headers=auth)
        assert dry.status == 400, await dry.text()
        started = await client.post("/admin/events/replay", json=asked | {"rate": 1000}, headers=auth)
        assert started.status == 400, await started.text()
        assert (await started.json())["error"].startswith("invalid_")
    assert await _replays(admin_settings.database_url) == []
    assert await queued_events(admin_settings.amqp_url, admin_settings.namespace) == []


async def test_what_a_cancel_reports_published_is_all_that_is_ever_published(settings):
    await _seed_invoices(settings.database_url, 2)
    connection = await asyncpg.connect(settings.database_url)
    try:
        store = _CancelledMidItem(connection, settings.database_url)
        replay = await claimed_replay(store, "stripe")
        async with confirm_channel(settings) as channel:
            job = replay_job(replay, store, channel, settings.namespace)
            ended = await run(job)
        assert store.cancelling is not None
        await asyncio.wait_for(store.cancelling, 10)  # what it saw, once it returned
        finished = await store.get(replay.id)
    finally:
        await connection.close()
    queued = await queued_events(settings.amqp_url, settings.namespace)
    assert store.seen is not None and store.seen.state == "cancelled"
    assert (ended, finished.state) == ("cancelled", "cancelled")
    assert len(queued) == store.seen.published == finished.published


async def test_a_cancel_behind_a_runner_that_died_mid_publish_reports_what_is_published(settings):
    await _seed_invoices(settings.database_url, 2)
    connection = await asyncpg.connect(settings.database_url)
    try:
        store = _DiesAfterPublishing(connection, settings.database_url)
        replay = await claimed_replay(store, "stripe")
        async with confirm_channel(settings) as channel:
            await run(replay_job(replay, store, channel, settings.namespace))
        assert store.cancelling is not None
        await asyncio.wait_for(store.cancelling, 10)
    finally:
        await connection.close()
    queued = await queued_events(settings.amqp_url, settings.namespace)
    assert store.seen is not None and store.seen.state == "cancelled"
    assert len(queued) == 1  # the dead runner's event went out
    assert store.seen.published == len(queued)
    assert (store.seen.document()["in_doubt"], store.seen.handled) == (1, 1)  # said to be in doubt, not hidden


async def test_the_console_offers_to_resume_a_replay_whose_process_died(admin_settings):
    """R3: such a replay stayed 'running' with no step; the claim takes it
    back after 30 s plus two intervals, but the console offered Resume only
    for 'failed': its page had Cancel and no Resume and polled for ever."""
    await _seed_invoices(admin_settings.database_url, 2)
    connection = await asyncpg.connect(admin_settings.database_url)
    try:  # an ingress claimed it, then was SIGKILLed before its first step
        store = EventReplayStore(connection)
        replay = await claimed_replay(store, "stripe")
        await connection.execute(
            "UPDATE event_replays SET stepped_at = now() - interval '1 minute' WHERE id = $1", replay.id
        )
    finally:
        await connection.close()
    async with running_ingress(admin_settings, load_sources(None)) as client:
        await console_login(client, TOKEN)
        path = f"/console/event-replays/{replay.id}"
        page = await (await client.get(path)).text()
        assert f'action="{path}/start"' in page and ">Resume</button>" in page, page[-1500:]
        csrf = re.search(r'name="csrf_token" value="([^"]+)"', page)[1]
        await client.post(f"{path}/start", data={"csrf_token": csrf, "rate": "1000"})

        async def done() -> bool:
            return "State: <strong>done</strong>" in await (await client.get(path)).text()

        await wait_until(done, 10, message="the resumed replay done")
    queued = await queued_events(admin_settings.amqp_url, admin_settings.namespace)
    assert [event.key for event in queued] == [f"replay-{replay.id}/stripe:evt_1", f"replay-{replay.id}/stripe:evt_2"]


@pytest.mark.parametrize("rate", [1e-300, 1e-9])
async def test_a_rate_too_small_to_ever_finish_is_refused(admin_settings, rate):
    """R4: any rate above 0 was taken: at 1e-300 a second the run published
    one event and slept for ever, and once its process died the claim's
    30 s + 2/rate overflowed in Postgres: it could never be resumed."""
    await seed_archive(admin_settings.database_url, [archived_event("stripe", "evt_1", AN_HOUR_AGO, "invoice.paid")])
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with running_ingress(admin_settings, load_sources(None)) as client:
        started = await client.post("/admin/events/replay", json={"source": "stripe", "rate": rate}, headers=auth)
        assert (started.status, (await started.json())["error"]) == (400, "invalid_rate")
    assert await _replays(admin_settings.database_url) == []


async def test_a_runner_whose_claim_was_taken_over_stops_and_says_so(settings):
    """R5: a runner whose claim was taken over (no step for 30 s + 2/rate,
    then Resume elsewhere) did not know it: on waking, reading 'done', it
    wrote events_replay state 'cancelled' under its own actor though nobody
    cancelled, and could finish the new run's state. Now its step and finish
    are fenced by the claim's stepped_at: it stops, 'taken_over'. (It
    stalled between items: one stalled mid-item is the test below.)"""
    ends, keys, finished = await _taken_over_while_stalled(settings, in_publish=False)
    assert ends == ["done", "taken_over"]
    assert keys == [f"replay-{finished.id}/stripe:evt_{n}" for n in (1, 2, 3)]
    assert (finished.state, finished.published, finished.handled) == ("done", 3, 3)


async def test_a_runner_stalled_holding_its_run_is_let_go_by_the_server_and_publishes_nothing_after(
    settings, monkeypatch
):
    """R2's row lock held by a runner that stalls mid-item (in its publish)
    would keep a Cancel or a Resume waiting for as long as it stalls: the
    server ends its session after HOLD_SECONDS idle in its transaction,
    which frees the row; the Resume elsewhere then runs the replay, and the
    stalled runner, waking without its session, publishes nothing more (its
    end is not audited: Postgres is gone for it, and it logs
    paced_run_audit_lost). Had its publish left before it stalled, the
    Resume's would be a copy of its key, settled by the workers."""
    monkeypatch.setattr(run_locks, "HOLD_SECONDS", 2.0)  # a fast test
    ends, keys, finished = await _taken_over_while_stalled(settings, in_publish=True)
    assert ends == ["done"]
    assert keys == [f"replay-{finished.id}/stripe:evt_{n}" for n in (1, 2, 3)]
    assert (finished.state, finished.published, finished.handled) == ("done", 3, 3)


async def test_a_cancel_from_the_previous_release_reports_what_is_published(settings):
    await _seed_invoices(settings.database_url, 2)
    connection = await asyncpg.connect(settings.database_url)
    try:
        store = EventReplayStore(connection)
        replay = await claimed_replay(store, "stripe")
        async with confirm_channel(settings) as channel:
            job = _CancelledByThePreviousRelease(
                replay, Actor.cli(), store, lambda: channel, settings.namespace, database_url=settings.database_url
            )
            await run(job)
        assert job.cancelling is not None
        await asyncio.wait_for(job.cancelling, 10)
    finally:
        await connection.close()
    queued = await queued_events(settings.amqp_url, settings.namespace)
    assert job.seen is not None and job.seen.state == "cancelled"
    assert len(queued) == job.seen.published
