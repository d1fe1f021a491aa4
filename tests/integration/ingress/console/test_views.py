"""The console's pages against bad input (docs/reference.md §8.1): unknown
ids, garbage filters, long search text, a dead letter someone else replayed
meanwhile — each a clear message in the page, never a 500. The ingress app
with aiohttp's test client; the browser tests are in
tests/acceptance/test_console.py."""

import asyncio
import re

import asyncpg
import pytest
from click.testing import CliRunner

from tests.support.console import csrf_of, signed_in
from tests.support.dead_letters import seed_dead_letters
from tests.support.heartbeats import seed_workers
from tests.support.ingress import running_ingress
from tests.support.processes import count_rows, wait_until
from webhook_ingest.cli.main import main
from webhook_ingest.ingress.console.bulk import _DeadLetterJob
from webhook_ingest.shared.audit.actor import Actor
from webhook_ingest.shared.dead_letters.store import DeadLetterStore
from webhook_ingest.shared.runs import locks as run_locks
from webhook_ingest.shared.runs import paced as paced_runs
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources

OPERATOR = "operator-token-for-the-page-tests"


@pytest.fixture
def console_settings(settings, monkeypatch) -> Settings:
    monkeypatch.setenv("WEBHOOK_INGEST_ADMIN_TOKEN", OPERATOR)
    return Settings()


async def test_the_console_is_absent_without_an_operator_token(settings):
    async with running_ingress(settings, load_sources(None)) as client:
        for path in ("/console/", "/console/login", "/console/static/console.css"):
            assert (await client.get(path)).status == 404, path


async def test_bad_input_is_a_message_in_the_page_never_a_500(console_settings):
    [dead] = await seed_dead_letters(console_settings.database_url, "acme", 1)
    async with running_ingress(console_settings, load_sources(None)) as client:
        csrf = await signed_in(client, OPERATOR)
        for path, status, text in (
            ("/console/dead-letters/999999", 404, "There is no dead letter with id 999999."),
            ("/console/dead-letters/-1", 400, "Dead-letter ids are positive whole numbers"),
            ("/console/dead-letters/99999999999999999999999", 400, "Dead-letter ids are positive whole numbers"),
            ("/console/dead-letters?status=zombie", 400, "Status must be one of"),
            ("/console/dead-letters?since=yesterday&until=%00", 400, "is not a date and time"),
            ("/console/dead-letters?q=" + "x" * 5000, 400, "The search text is too long (5000 characters"),
            ("/console/dead-letters?before=%F0%9F%92%A5", 200, "The page link is not valid"),
            ("/console/bulk/424242", 404, "There is no bulk action 424242."),
            ("/console/no-such-page", 404, "There is no such page."),
        ):
            response = await client.get(path)
            assert (response.status, response.content_type) == (status, "text/html"), path
            assert text in await response.text(), path

        refused = await client.post("/console/bulk", data={"csrf_token": csrf, "action": "replay", "since": "soon"})
        assert refused.status == 400 and "is not a date and time" in await refused.text()
        nothing = await client.post("/console/bulk", data={"csrf_token": csrf, "action": "replay", "source": "none"})
        assert "No open dead letters match this filter" in await nothing.text()

        replayed_meanwhile = await asyncio.to_thread(CliRunner().invoke, main, ["dlq", "replay", str(dead)])
        assert replayed_meanwhile.exit_code == 0, replayed_meanwhile.stderr
        again = await client.post(f"/console/dead-letters/{dead}/replay", data={"csrf_token": csrf})
        assert again.status == 200
        assert f"Dead letter {dead} was replayed meanwhile; nothing was done." in await again.text()


async def test_a_bulk_discard_acts_on_the_frozen_set_and_skips_what_changed_meanwhile(console_settings):
    database = console_settings.database_url
    first, second, third = await seed_dead_letters(database, "acme", 3)
    [other] = await seed_dead_letters(database, "other", 1, start=10)
    async with running_ingress(console_settings, load_sources(None)) as client:
        csrf = await signed_in(client, OPERATOR)
        prepared = await client.post("/console/bulk", data={"csrf_token": csrf, "action": "discard", "source": "acme"})
        assert "3</strong> open dead letters match" in await prepared.text()
        bulk_path = prepared.url.path
        [late] = await seed_dead_letters(database, "acme", 1, start=20)  # after the count: not in the set
        replayed = await asyncio.to_thread(CliRunner().invoke, main, ["dlq", "replay", str(second)])
        assert replayed.exit_code == 0, replayed.stderr  # changed meanwhile: skipped

        await client.post(f"{bulk_path}/start", data={"csrf_token": csrf, "rate": "1000"})
        await wait_until(_page_says(client, bulk_path, "State: <strong>done</strong>"), 30, message="bulk done")
        page = await (await client.get(bulk_path)).text()
    assert "2 of 3 discarded" in page and "1 skipped" in page
    assert await _statuses(database) == {
        first: "discarded",
        second: "replayed",
        third: "discarded",
        other: "dead",
        late: "dead",
    }


class _CancelledMidDiscard(DeadLetterStore):
    """The store, with a Cancel from elsewhere (another ingress process)
    arriving as the runner starts on its first dead letter, after it read
    `running`: what the Cancel reported is kept in `seen`."""

    def __init__(self, pool, database_url: str):
        super().__init__(pool)
        self._database_url, self.seen = database_url, None
        self.cancelling: asyncio.Task | None = None

    async def discard_if_open(self, dead_letter_id, actor, bulk_action_id=None, held=None):
        if self.cancelling is None:
            cancelling = self.cancelling = asyncio.create_task(self._cancel(bulk_action_id))
            await wait_until(
                lambda: _answered_or_waiting(cancelling, self._database_url), 10, message="the cancel answered or waits"
            )
        await super().discard_if_open(dead_letter_id, actor, bulk_action_id, held)

    async def _cancel(self, bulk_action_id: int) -> None:
        other = await asyncpg.connect(self._database_url)
        try:
            store = DeadLetterStore(other)
            assert await store.cancel_bulk(bulk_action_id)
            self.seen = await store.bulk_action(bulk_action_id)
        finally:
            await other.close()


async def _answered_or_waiting(cancelling: asyncio.Task, database_url: str) -> bool:
    return (
        cancelling.done()
        or await count_rows(
            database_url,
            "pg_stat_activity",
            f"wait_event_type = 'Lock' AND datname = current_database() AND query = '{run_locks.WAIT_FOR_RUN}'",
        )
        > 0
    )


async def test_what_a_bulk_cancel_reports_done_is_all_that_is_ever_done(console_settings):
    """R2 of the event replays adversary round, in the machinery it shares
    with the dead letters' bulk actions: a Cancel between the runner's state
    read and its act was answered 'cancelled, 0 done' and the dead letter
    was discarded after it anyway. The runner holds the action's row from
    its state read to its step, and the Cancel waits for it."""
    database = console_settings.database_url
    first, second = await seed_dead_letters(database, "acme", 2)
    pool = await asyncpg.create_pool(database, min_size=1, max_size=3)
    try:
        store = _CancelledMidDiscard(pool, database)
        action = await store.claim_bulk(await store.prepare_bulk("discard", [first, second], {}, Actor.cli()), 1000)
        assert action is not None
        assert (
            await paced_runs.run(_DeadLetterJob(action, Actor.cli(), store, None, console_settings.namespace))
            == "cancelled"
        )
        assert store.cancelling is not None
        await asyncio.wait_for(store.cancelling, 10)
        finished = await store.bulk_action(action.id)
    finally:
        await pool.close()
    assert store.seen is not None and store.seen.state == "cancelled"
    assert store.seen.done == finished.done == [first]
    assert await _statuses(database) == {first: "discarded", second: "dead"}


async def test_a_bulk_cancel_that_cannot_take_the_action_in_time_says_so_and_changes_nothing(
    console_settings, monkeypatch
):
    """The Cancel waits for the dead letter in flight at most WAIT_SECONDS
    (shared/runs/locks.py): past it, a message, and the action as it was."""
    monkeypatch.setattr(run_locks, "WAIT_SECONDS", 0.5)  # a fast test
    database = console_settings.database_url
    ids = await seed_dead_letters(database, "acme", 2)
    holder = await asyncpg.connect(database)
    try:
        bulk_action_id = await DeadLetterStore(holder).prepare_bulk("discard", ids, {}, Actor.cli())
        async with running_ingress(console_settings, load_sources(None)) as client:
            csrf = await signed_in(client, OPERATOR)
            async with holder.transaction():  # a runner in the middle of a dead letter
                await holder.execute("SELECT FROM console_bulk_actions WHERE id = $1 FOR UPDATE", bulk_action_id)
                busy = await client.post(f"/console/bulk/{bulk_action_id}/cancel", data={"csrf_token": csrf})
                assert "too long to wait for: nothing was changed; try again" in await busy.text()
            assert (await DeadLetterStore(holder).bulk_action(bulk_action_id)).state == "prepared"
            cancelled = await client.post(f"/console/bulk/{bulk_action_id}/cancel", data={"csrf_token": csrf})
            assert "Cancelled: what was done stays done." in await cancelled.text()
    finally:
        await holder.close()
    assert await _statuses(database) == {ids[0]: "dead", ids[1]: "dead"}


async def test_the_overview_shows_the_open_dead_letters_and_the_last_hour(console_settings):
    await seed_dead_letters(console_settings.database_url, "acme", 2)
    async with running_ingress(console_settings, load_sources(None)) as client:
        await signed_in(client, OPERATOR)
        figures = await (await client.get("/console/", headers={"HX-Request": "true"})).text()
    assert '<a href="/console/dead-letters">2</a>' in figures
    assert '<td>dead</td><td class="number">2</td>' in figures
    assert "PostgreSQL is unreachable" not in figures


def _page_says(client, path: str, text: str):
    async def check() -> bool:
        return text in await (await client.get(path)).text()

    return check


async def _statuses(database_url: str) -> dict[int, str]:
    connection = await asyncpg.connect(database_url)
    try:
        return {row["id"]: row["status"] for row in await connection.fetch("SELECT id, status FROM dead_letters")}
    finally:
        await connection.close()


async def test_sign_in_is_throttled_before_the_token_is_checked(console_settings):
    async with running_ingress(console_settings, load_sources(None)) as client:
        login = await (await client.get("/console/login")).text()
        answers = [
            await client.post("/console/login", data={"csrf_token": csrf_of(login), "token": "guess"}) for _ in range(6)
        ]
        assert [answer.status for answer in answers] == [401] * 5 + [429]
        assert int(answers[-1].headers["Retry-After"]) > 0
        assert "Too many sign-in attempts" in await answers[-1].text()
        right = await client.post("/console/login", data={"csrf_token": csrf_of(login), "token": OPERATOR})
        assert right.status == 429  # the right token too: nothing tells a guess it was right


async def test_the_overview_shows_each_worker_and_the_last_hour_per_minute(console_settings):
    """Issue 35, requirement 7: each worker's state and figures, a silent
    one named as such, and the hour's outcomes as a chart with its table."""
    ids = await seed_workers(console_settings.database_url)
    async with running_ingress(console_settings, load_sources(None)) as client:
        await signed_in(client, OPERATOR)
        figures = await (await client.get("/console/", headers={"HX-Request": "true"})).text()
    rows = {
        state: re.search(rf"<code>{re.escape(worker_id)}</code>.*?</tr>", figures, re.S)[0]
        for state, worker_id in ids.items()
    }
    for state, row in rows.items():
        assert f'<span class="state {state}">{state}</span>' in row, (state, row)
    assert re.search(r'class="number">(4[0-9]) s ago<', rows["silent"])  # its last beat, 40 s ago
    assert '<td class="number">3 of 26</td>' in rows["live"]
    assert '<td class="number">2</td>' in rows["silent"]  # its lease losses in the last 15 minutes
    assert '<a href="#workers-heading">2</a>' in figures and "1 silent,\n      1 degraded." in figures
    chart = re.search(r'<svg class="outcome-chart".*?</svg>', figures, re.S)[0]
    assert '<title id="minutes-title">Outcomes per minute, last hour (UTC)</title>' in chart
    assert chart.count('<g class="minute">') == 60
    assert re.search(r'<desc id="minutes-desc">In the last 60 minutes: \d+ processed, \d+ retried, 18 dead,', chart)
    assert figures.count("<tr><td>") >= 60  # the same figures as a table
    assert "PostgreSQL is unreachable" not in figures
