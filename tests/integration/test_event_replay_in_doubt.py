"""What on-call is told of a replay cancelled behind a runner that died
mid-publish (docs/reference.md §8, "Replaying archived events"): the admin
API's answer, the console's page, `events replay --show` and the audit log
each say that the event counted published may not have gone out. Real
Postgres and RabbitMQ; the runner's death is its session's end."""

import asyncio
import json
from datetime import timedelta

import asyncpg
import pytest
from click.testing import CliRunner

from tests.support.archive import archived_event, minutes_ago, seed_archive
from tests.support.event_replays import DiesAfterItsFirstPublish, claimed_replay, replay_job
from tests.support.ingress import console_login, queued_events, running_ingress
from webhook_ingest.cli.dlq import confirm_channel
from webhook_ingest.cli.main import main
from webhook_ingest.shared.runs.paced import run
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources

TOKEN = "s3cret-admin-token-of-the-in-doubt-tests"


@pytest.fixture
def admin_settings(settings, monkeypatch) -> Settings:
    monkeypatch.setenv("WEBHOOK_INGEST_ADMIN_TOKEN", TOKEN)
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


async def test_a_cancel_behind_a_dead_runner_says_in_doubt_everywhere(admin_settings):
    replay_id = await _a_runner_died_after_its_first_publish(admin_settings)
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with running_ingress(admin_settings, load_sources(None)) as client:
        cancelled = await client.post(f"/admin/events/replay/{replay_id}/cancel", headers=auth)
        assert cancelled.status == 200
        answer = await cancelled.json()
        await console_login(client, TOKEN)
        page = await (await client.get(f"/console/event-replays/{replay_id}")).text()
    shown = await asyncio.to_thread(CliRunner().invoke, main, ["events", "replay", "--show", str(replay_id)])
    connection = await asyncpg.connect(admin_settings.database_url)
    try:
        audit = await connection.fetch("SELECT via, detail FROM audit_log WHERE action = 'events_replay_cancelled'")
    finally:
        await connection.close()
    assert len(await queued_events(admin_settings.amqp_url, admin_settings.namespace)) == 1
    assert (answer["state"], answer["handled"], answer["published"], answer["in_doubt"]) == ("cancelled", 1, 1, 1)
    assert "In doubt:" in page and "may not have gone out" in page
    assert shown.exit_code == 0, shown.stderr
    assert "1 published, 1 of them in doubt" in shown.stdout and "may not have gone out" in shown.stdout
    assert [(row["via"], json.loads(row["detail"])["in_doubt"]) for row in audit] == [("admin-api", 1)]
