"""The console's ordering keys (ingress/console/ordering.py; docs/reference.md
§8.1): the overview's line of blocked keys, the Ordering page listing each
blocked key with the dead letter that frees it, and "blocks ordering key K,
N events wait" on that dead letter's page; its Replay frees the key. The
ingress app with aiohttp's test client; the runner (B) stubbed by rows
written as it leaves them."""

import html
import re

import pytest

from tests.support.console import signed_in
from tests.support.ingress import running_ingress
from tests.support.ordering_lanes import LANE, block_lane
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources

OPERATOR = "operator-token-for-the-ordering-pages"


@pytest.fixture
def console_settings(settings, monkeypatch) -> Settings:
    monkeypatch.setenv("WEBHOOK_INGEST_ADMIN_TOKEN", OPERATOR)
    return Settings()


def text_of(page: str) -> str:
    spaced = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())
    return re.sub(r" ([).,:])", r"\1", spaced)


async def test_a_blocked_key_is_on_the_overview_the_ordering_page_and_its_dead_letters_page(console_settings):
    dead_letter_id = await block_lane(console_settings.database_url, minutes_ago=25)
    other = await block_lane(console_settings.database_url, "shop#billing:inv_9", versions=2, minutes_ago=3)
    async with running_ingress(console_settings, load_sources(None)) as client:
        csrf = await signed_in(client, OPERATOR)

        overview = await (await client.get("/console/")).text()
        assert "Blocked ordering keys" in overview and 'href="/console/ordering">2</a>' in overview
        assert "Oldest blocked 25 min ago" in text_of(overview)

        page = await (await client.get("/console/ordering")).text()
        rows = re.findall(r'<tr id="lane-(\d+)">(.*?)</tr>', page, re.S)
        assert [int(found) for found, _ in rows] == [dead_letter_id, other]  # oldest block first
        first = text_of(rows[0][1])
        assert first.startswith("acme — obj_1") and "25 min 2" in first
        assert f'href="/console/dead-letters/{dead_letter_id}"' in rows[0][1]
        assert text_of(rows[1][1]).startswith("shop billing inv_9")
        only = await (await client.get("/console/ordering?source=shop")).text()
        assert re.findall(r'<tr id="lane-(\d+)">', only) == [str(other)]

        letter = text_of(await (await client.get(f"/console/dead-letters/{dead_letter_id}")).text())
        assert f"This dead letter blocks ordering key obj_1 (lane {LANE})" in letter
        assert "2 events wait behind it" in letter
        single = text_of(await (await client.get(f"/console/dead-letters/{other}")).text())
        assert "1 event waits behind it" in single

        replayed = await client.post(f"/console/dead-letters/{dead_letter_id}/replay", data={"csrf_token": csrf})
        assert replayed.status == 200 and f"Dead letter {dead_letter_id} replayed." in await replayed.text()
        assert "blocks ordering key" not in await (await client.get(f"/console/dead-letters/{dead_letter_id}")).text()
        after = await (await client.get("/console/ordering")).text()
        assert re.findall(r'<tr id="lane-(\d+)">', after) == [str(other)]


async def test_no_blocked_key_is_said_and_the_overview_has_no_line_without_ordered_sources(console_settings):
    async with running_ingress(console_settings, load_sources(None)) as client:
        await signed_in(client, OPERATOR)
        assert "No ordering key is blocked." in await (await client.get("/console/ordering")).text()
        assert "Blocked ordering keys" not in await (await client.get("/console/")).text()
