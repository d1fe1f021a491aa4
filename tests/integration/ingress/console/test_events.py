"""The console's Events pages (docs/reference.md §8.1, issue 22 item 4):
the search with the admin API's filters, its pages and capped count, bad
input as a message in the page (never a 500), an event's page with its
body, headers, copies, conflicts, attempts and replays — whatever a body
or a header holds, shown as escaped text — and the archive's size on the
overview. The real ingress app with aiohttp's test client and real
Postgres; the browser test is in tests/acceptance/test_console.py."""

import asyncio
import dataclasses
import html
import re
from urllib.parse import quote

import asyncpg
import pytest
from click.testing import CliRunner

from tests.support.archive import archived_event, minutes_ago, seed_archive
from tests.support.console import signed_in
from tests.support.dead_letters import failure
from tests.support.ingress import running_ingress
from tests.support.processes import wait_until
from webhook_ingest.cli.main import main
from webhook_ingest.ingress.console import events as console_events
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.dead_letters.model import record_dead_letter
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources

OPERATOR = "operator-token-for-the-event-page-tests"
INJECTED = "<script>alert('x')</script>"


@pytest.fixture
def console_settings(settings, monkeypatch) -> Settings:
    monkeypatch.setenv("WEBHOOK_INGEST_ADMIN_TOKEN", OPERATOR)
    return Settings()


def keys_listed(page: str) -> list[str]:
    return [html.unescape(key) for key in re.findall(r'<td class="key"><a href="[^"]+">([^<]+)</a>', page)]


async def page_of(client, path: str, params: dict | None = None, status: int = 200) -> str:
    response = await client.get(path, params=params)
    text = await response.text()
    assert (response.status, response.content_type) == (status, "text/html"), (path, params, text[-2000:])
    return text


@pytest.fixture
async def stripe(console_settings):
    """Three invoices (processed with a copy and a conflict, dead, queued) and a github push."""
    paid = archived_event("stripe", "evt_1", minutes_ago(50), "invoice.paid", customer="cus_123")
    failed = archived_event("stripe", "evt_2", minutes_ago(40), "invoice.paid", customer="cus_456")
    queued = archived_event("stripe", "evt_3", minutes_ago(30), "invoice.created", customer="cus_123")
    copy = dataclasses.replace(paid, received_at=minutes_ago(20).timestamp())
    conflict = archived_event("stripe", "evt_1", minutes_ago(10), "invoice.paid", customer="cus_999")
    push = archived_event("github", "d/1", minutes_ago(5), "push", ref="main")
    now = minutes_ago(0).timestamp()
    await seed_archive(
        console_settings.database_url,
        [paid, failed, queued, copy, conflict, push],
        [
            archive.outcome_row(paid, archive.PROCESSED, now),
            archive.outcome_row(copy, archive.DUPLICATE, now),
            archive.outcome_row(failed, archive.DEAD, now, "RuntimeError: receiver answered 500 (attempt 3)"),
            archive.outcome_row(conflict, archive.CONFLICT, now),
            archive.outcome_row(push, archive.PROCESSED, now),
        ],
    )
    connection = await asyncpg.connect(console_settings.database_url)
    try:
        dead_letter = await record_dead_letter(
            connection, dataclasses.replace(failed, attempt=3), [failure(n) for n in (1, 2, 3)]
        )
    finally:
        await connection.close()
    return {"dead_letter": dead_letter}


async def test_the_search_filters_as_the_admin_api_does(console_settings, stripe):
    async with running_ingress(console_settings, load_sources(None)) as client:
        await signed_in(client, OPERATOR)
        home = await page_of(client, "/console/")
        assert re.search(r'<nav aria-label="Console">\s*<a href="/console/events"', home)  # the first link

        everything = await page_of(client, "/console/events")
        assert keys_listed(everything) == [
            "github:d/1",
            "stripe:evt_1",
            "stripe:evt_1",
            "stripe:evt_3",
            "stripe:evt_2",
            "stripe:evt_1",
        ]
        assert "<strong>6</strong> archived events match" in everything
        assert '<td class="number">1 <span class="status conflict">+1 conflict' in everything  # evt_1's copies

        async def keys(**params) -> list[str]:
            return keys_listed(await page_of(client, "/console/events", params))

        assert await keys(source="github") == ["github:d/1"]
        assert await keys(status="dead", type="invoice.paid") == ["stripe:evt_2"]
        assert await keys(payload='{"customer": "cus_123"}') == ["stripe:evt_1", "stripe:evt_3", "stripe:evt_1"]
        assert await keys(key="stripe:evt_2") == ["stripe:evt_2"]
        assert await keys(event_id="d/") == ["github:d/1"]
        since, until = minutes_ago(45).isoformat(), minutes_ago(25).isoformat()
        assert await keys(since=since, until=until) == ["stripe:evt_3", "stripe:evt_2"]
        assert await keys(since=minutes_ago(7).strftime("%Y-%m-%dT%H:%M:%S")) == ["github:d/1"]  # UTC, as typed
        none = await page_of(client, "/console/events", {"source": "nowhere"})
        assert "No archived events match." in none and keys_listed(none) == []


async def test_pages_follow_one_another_and_the_count_stops_at_its_cap(console_settings, monkeypatch):
    await seed_archive(
        console_settings.database_url, [archived_event("acme", f"evt_{n:03}", minutes_ago(200 - n)) for n in range(120)]
    )
    monkeypatch.setattr(console_events, "COUNT_CAP", 100)
    async with running_ingress(console_settings, load_sources(None)) as client:
        await signed_in(client, OPERATOR)
        seen, path, pages = [], "/console/events?source=acme", 0
        while path:
            page = await page_of(client, html.unescape(path))
            assert "<strong>100+</strong> archived events match" in page
            seen += keys_listed(page)
            pages += 1
            assert ("Newest</a>" in page) == (pages > 1)
            following = re.search(r'<a href="(/console/events\?[^"]+)" rel="next">Next page</a>', page)
            path = following[1] if following else None
            if path:
                assert "source=acme" in path  # the filter goes along
    assert pages == 3 and seen == [f"acme:evt_{n:03}" for n in reversed(range(120))]


@pytest.mark.parametrize(
    "params, problem",
    [
        ({"payload": "{customer: cus_123}"}, "Payload contains: “{customer: cus_123}” is not valid — a JSON object"),
        ({"payload": "[1, 2]"}, "Payload contains: “[1, 2]” is not valid — a JSON object"),
        ({"payload": '{"n": NaN}'}, "is not valid — a JSON object"),
        ({"payload": '{"a": "\\u0000"}'}, "a NUL or an unpaired surrogate cannot be searched for"),
        ({"since": "yesterday"}, "From: “yesterday” is not valid — an ISO 8601 time"),
        ({"until": "2026-13-45T99:00"}, "Until: “2026-13-45T99:00” is not valid"),
        ({"status": "zombie"}, "Status: “zombie” is not valid — one of queued, processing"),
        ({"source": "a\x00b"}, "Source: “a\\x00b” is not valid — a NUL"),
    ],
)
async def test_bad_filter_input_is_a_message_in_the_page_never_a_500(console_settings, stripe, params, problem):
    async with running_ingress(console_settings, load_sources(None)) as client:
        await signed_in(client, OPERATOR)
        query = "&".join(f"{name}={_quote(value)}" for name, value in params.items())
        page = await page_of(client, f"/console/events?{query}", status=400)
    assert problem in html.unescape(page)
    assert keys_listed(page) == [] and "archived events match" not in page  # nothing searched


async def test_a_bad_page_link_or_key_is_a_message(console_settings, stripe):
    async with running_ingress(console_settings, load_sources(None)) as client:
        await signed_in(client, OPERATOR)
        page = await page_of(client, "/console/events?cursor=not-a-cursor")
        assert "The page link is not valid; showing the newest events." in page and len(keys_listed(page)) == 6
        for key in ("stripe:nope", "%00", "%ED%A0%80", "x" * 3000):
            missing = await page_of(client, f"/console/events/{key}", status=404)
            assert "No arrival of the key" in missing


async def test_an_events_page_shows_its_body_headers_copies_conflicts_attempts_and_dead_letter(
    console_settings, stripe
):
    dead_letter = stripe["dead_letter"]
    async with running_ingress(console_settings, load_sources(None)) as client:
        await signed_in(client, OPERATOR)
        listed = await page_of(client, "/console/events", {"key": "stripe:evt_1"})
        assert 'href="/console/events/stripe:evt_1"' in listed
        page = html.unescape(await page_of(client, "/console/events/stripe:evt_1"))
        assert '"customer": "cus_123"' in page and '"customer": "cus_999"' in page  # the event, its conflict
        assert "<dt>Copies</dt><dd>1: <time>" in page and "<dt>Conflicts</dt><dd>1 " in page
        assert "<code>content-type</code>" in page and "<code>application/json</code>" in page
        assert "Never replayed." in page

        dead = await page_of(client, "/console/events/stripe:evt_2")
        assert f'<a href="/console/dead-letters/{dead_letter}">{dead_letter}</a> (dead)' in dead
        assert dead.count("RuntimeError") >= 3 and "Attempt 3" in dead
        letter = await page_of(client, f"/console/dead-letters/{dead_letter}")
        assert '<a href="/console/events/stripe:evt_2">its archived event</a>' in letter  # and back

        replayed = await asyncio.to_thread(CliRunner().invoke, main, ["dlq", "replay", str(dead_letter)])
        assert replayed.exit_code == 0, replayed.output
        again = await page_of(client, "/console/events/stripe:evt_2")
        assert "Never replayed." not in again and "<td>cli:" in again  # who replayed it, from its dead letter

        slashed = await page_of(client, "/console/events/github:d%2F1")  # an event id with a slash
        assert '"ref": "main"' in html.unescape(slashed)


async def test_what_a_body_or_a_header_holds_is_shown_escaped(console_settings):
    headers = {"content-type": "text/html", "x-evil": "<img src=x onerror=alert(1)>"}
    await seed_archive(
        console_settings.database_url,
        [
            archived_event(
                "acme",
                "json",
                minutes_ago(3),
                body=b'{"type": "t", "note": "' + INJECTED.encode() + b'"}',
                headers=headers,
            ),
            archived_event("acme", "text", minutes_ago(2), body=b"a=1&b=" + INJECTED.encode(), headers=headers),
            archived_event("acme", "bytes", minutes_ago(1), body=b"\xff\xfe\x00<b>bold</b>", headers=headers),
            archived_event("acme", "<i>id</i>", minutes_ago(1), body=b"{}", headers=headers),
        ],
    )
    async with running_ingress(console_settings, load_sources(None)) as client:
        await signed_in(client, OPERATOR)
        listed = await page_of(client, "/console/events", {"source": "acme"})
        assert "<i>id</i>" not in listed and "acme:&lt;i&gt;id&lt;/i&gt;" in listed
        pages = {name: await page_of(client, f"/console/events/acme:{name}") for name in ("json", "text", "bytes")}
    for page in pages.values():
        assert "<script>" not in page and "<img" not in page and "<b>bold" not in page
        assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in pages["json"]
    assert "Not JSON: the body as received" in pages["text"] and "a=1&amp;b=&lt;script&gt;" in pages["text"]
    assert "Not UTF-8" in pages["bytes"] and "\\xff\\xfe\x00&lt;b&gt;bold&lt;/b&gt;" in pages["bytes"]


async def test_the_overview_shows_each_archived_sources_size_as_the_gauge_reads_it(console_settings):
    async with running_ingress(console_settings, load_sources(None)) as client:  # demo: retention 7d
        await signed_in(client, OPERATOR)

        async def measured() -> bool:
            figures = await page_of(client, "/console/", params=None)
            return (
                re.search(r'events\?source=demo">demo</a></td><td class="number">[\d.,]+ (KiB|MiB)<', figures)
                is not None
            )

        await wait_until(measured, 30, message="demo's archive size on the overview")


def _quote(value: str) -> str:
    return quote(value, safe="")


async def test_a_key_with_many_arrivals_shows_the_first_and_counts_them_all(console_settings, stripe, monkeypatch):
    monkeypatch.setattr(console_events, "SHOWN_ARRIVALS", 2)
    monkeypatch.setattr(console_events, "SHOWN_COPY_TIMES", 0)
    async with running_ingress(console_settings, load_sources(None)) as client:
        await signed_in(client, OPERATOR)
        page = await page_of(client, "/console/events/stripe:evt_1")
    assert "The first 2 of 3 arrivals:" in page and "<dt>Copies</dt><dd>1: , …</dd>" in page
    assert page.count("<tr><td>20") == 2  # the arrivals table holds the first two
