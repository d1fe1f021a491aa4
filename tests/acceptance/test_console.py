"""The on-call console (docs/reference.md §8.1) in a real headless Chromium
(Debian's `chromium`, driven by Playwright), against a real `webhook-ingest
ingress` process and the test's own database. Every request the page makes
to another host is aborted and fails the test.

`UPDATE_SCREENSHOTS=1` also writes each page to docs/console/*.png.
"""

import asyncio
import dataclasses
import os
import re
import shutil
from pathlib import Path

import aiohttp
import asyncpg
import pytest
from playwright.async_api import Page, async_playwright, expect

from tests.support.archive import archived_event, minutes_ago, ran, seed_archive
from tests.support.dead_letters import seed_dead_letters
from tests.support.heartbeats import seed_workers
from tests.support.ingress import queued_events
from tests.support.processes import wait_until
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.archive.store import ArchiveStore
from webhook_ingest.shared.sources.routes import route_key

pytestmark = pytest.mark.browser

OPERATOR_TOKEN = "operator-token-for-the-console-tests"
VIEWER_TOKEN = "viewer-token-for-the-console-tests"
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "console"
expect.set_options(timeout=20_000)  # a shared, busy CI machine: generous waits, never a fixed sleep


# -- fixtures --------------------------------------------------------------------


@pytest.fixture
def start_console(fleet):
    """Starts `webhook-ingest ingress` with the console on; returns its base URL."""

    async def start(**env: str) -> str:
        _, base = fleet.ingress(
            env={"WEBHOOK_INGEST_ADMIN_TOKEN": OPERATOR_TOKEN, "WEBHOOK_INGEST_VIEWER_TOKEN": VIEWER_TOKEN, **env}
        )
        await wait_until(_ready(base), 30, interval=0.1, message=f"{base}/readyz")
        return base

    return start


def _ready(base: str):
    async def check() -> bool:
        try:
            async with aiohttp.ClientSession() as session, session.get(f"{base}/readyz") as response:
                return response.status == 200
        except aiohttp.ClientError:
            return False

    return check


@pytest.fixture
async def browser():
    executable = shutil.which("chromium")
    assert executable, "Debian's chromium is not installed (apt-get install -y chromium; .ci/run does it)"
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield chromium
        await chromium.close()


@pytest.fixture
def open_page(browser):
    """A page in a fresh browser context that may reach only `base`."""
    outside: list[str] = []

    async def open_(base: str, javascript: bool = True) -> Page:
        context = await browser.new_context(
            base_url=base, viewport={"width": 1280, "height": 900}, java_script_enabled=javascript
        )
        context.set_default_timeout(20_000)

        async def only_the_ingress(route):
            if route.request.url.startswith(base + "/"):
                await route.continue_()
            else:
                outside.append(route.request.url)
                await route.abort()

        await context.route("**/*", only_the_ingress)
        return await context.new_page()

    yield open_
    assert outside == [], f"the console fetched from another host: {outside}"


async def sign_in(page: Page, token: str) -> None:
    await page.goto("/console/login")
    await page.get_by_label("Token").fill(token)
    await page.get_by_role("button", name="Sign in").click()


async def screenshot(page: Page, name: str) -> None:
    if os.environ.get("UPDATE_SCREENSHOTS"):
        SCREENSHOTS.mkdir(exist_ok=True)
        await page.screenshot(path=SCREENSHOTS / f"{name}.png", full_page=True)


async def statuses(database_url: str) -> dict[int, str]:
    connection = await asyncpg.connect(database_url)
    try:
        return {row["id"]: row["status"] for row in await connection.fetch("SELECT id, status FROM dead_letters")}
    finally:
        await connection.close()


# -- the tests -------------------------------------------------------------------


async def test_an_operator_filters_opens_replays_and_finds_it_in_the_audit(start_console, open_page, service_env):
    """With JavaScript off: every page and button works without it."""
    database = service_env["DATABASE_URL"]
    acme = await seed_dead_letters(database, "acme", 3)
    await seed_dead_letters(database, "other", 2, start=10, text="connection refused")
    page = await open_page(await start_console(), javascript=False)

    await page.goto("/console/login")
    await screenshot(page, "login")
    await sign_in(page, OPERATOR_TOKEN)
    await expect(page.get_by_role("heading", name="Open dead letters")).to_be_visible()
    await expect(page.get_by_role("link", name="5", exact=True)).to_be_visible()
    await screenshot(page, "overview")

    await page.get_by_role("link", name="Dead letters").click()
    await page.get_by_label("Source").fill("acme")
    await page.get_by_role("button", name="Filter").click()
    rows = page.locator("table.dead-letters tbody tr")
    await expect(rows).to_have_count(3)
    await expect(rows.first).to_contain_text("RuntimeError: receiver answered 500 (attempt 3)")
    await screenshot(page, "dead-letters")

    target = acme[1]
    await page.get_by_role("link", name=str(target), exact=True).click()
    await expect(page.get_by_role("heading", name=f"Dead letter {target}")).to_be_visible()
    await expect(page.locator("pre.payload")).to_contain_text('"customer": {')
    await expect(page.get_by_text("Attempt 3", exact=True)).to_be_visible()
    await screenshot(page, "dead-letter")
    await page.get_by_role("button", name="Replay").click()
    await expect(page.get_by_role("status").filter(has_text=f"Dead letter {target} replayed.")).to_be_visible()
    await expect(page.get_by_role("button", name="Replay")).to_have_count(0)
    await expect(page.locator("section", has_text="Replay history")).to_contain_text("operator (console)")

    await page.get_by_role("link", name="Audit").click()
    first_entry = page.locator("table.audit tbody tr").first
    await expect(first_entry).to_contain_text("replay")
    await expect(first_entry).to_contain_text("operator")
    await expect(first_entry.get_by_role("link", name=str(target), exact=True)).to_be_visible()
    await screenshot(page, "audit")

    assert [
        event.key for event in await queued_events(service_env["AMQP_URL"], service_env["WEBHOOK_INGEST_NAMESPACE"])
    ] == ["acme:evt_1"]
    assert {i: s for i, s in (await statuses(database)).items() if s != "dead"} == {target: "replayed"}


async def test_on_call_searches_the_archive_and_opens_an_event(start_console, open_page, service_env):
    """Issue 22 item 4: the Events page's search, its count, an event's page;
    a payload and a header holding HTML are shown as text, never run."""
    evil = {"content-type": "application/json", "x-note": "<img src=x onerror=alert(1)>"}
    paid = archived_event(
        "stripe",
        "evt_1",
        minutes_ago(30),
        "invoice.paid",
        customer="cus_123",
        note="<script>alert(1)</script>",
        headers=evil,
    )
    copy = dataclasses.replace(paid, received_at=minutes_ago(25).timestamp())
    done = minutes_ago(29).timestamp()
    await seed_archive(
        service_env["DATABASE_URL"],
        [
            paid,
            copy,
            archived_event("stripe", "evt_2", minutes_ago(20), "invoice.paid", customer="cus_456"),
            archived_event("stripe", "evt_3", minutes_ago(10), "invoice.created", customer="cus_123"),
        ],
        [archive.outcome_row(paid, archive.PROCESSED, done), archive.outcome_row(copy, archive.DUPLICATE, done)],
    )
    page = await open_page(await start_console())
    dialogs: list[str] = []
    page.on("dialog", lambda dialog: dialogs.append(dialog.message))
    await sign_in(page, OPERATOR_TOKEN)

    await page.get_by_role("navigation", name="Console").get_by_role("link").first.click()
    await expect(page.get_by_role("heading", name="Events")).to_be_visible()
    await page.get_by_label("Source").fill("stripe")
    await page.get_by_label("Payload contains").fill('{"customer": "cus_123"}')
    await page.get_by_role("button", name="Search", exact=True).click()
    rows = page.locator("table.events tbody tr")
    await expect(rows).to_have_count(3)  # evt_3, evt_1's copy, evt_1
    await expect(page.locator("#event-count")).to_contain_text("3 archived events match")
    await expect(rows.first).to_contain_text("invoice.created")
    await expect(rows.last).to_contain_text("processed")
    await screenshot(page, "events")

    await rows.last.get_by_role("link", name="stripe:evt_1", exact=True).click()
    await expect(page.get_by_role("heading", name="Event stripe:evt_1")).to_be_visible()
    await expect(page.locator("dl.facts")).to_contain_text("Copies1: 20")  # how many, and when
    await expect(page.locator("pre.payload").first).to_contain_text('"note": "<script>alert(1)</script>"')
    await expect(page.locator("table.headers").first).to_contain_text("<img src=x onerror=alert(1)>")
    await screenshot(page, "event")
    assert dialogs == []


async def test_a_routed_events_page_shows_each_routes_completion(start_console, open_page, service_env, tmp_path):
    """Each route completes under KEY#ROUTE: the page lists every route of
    the source with its completion, or a dash (tests/integration/shared/sources/test_routes.py)."""
    sources = tmp_path / "sources.toml"
    sources.write_text(
        '[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["s"]\n'
        '[[sources.acme.routes]]\nname = "billing"\nhandler = "inbox"\n'
        '[[sources.acme.routes]]\nname = "audit"\nhandler = "inbox"\n'
    )
    event = archived_event("acme", "evt_s", minutes_ago(5), "invoice.paid")
    await seed_archive(service_env["DATABASE_URL"], [event])
    connection = await asyncpg.connect(service_env["DATABASE_URL"])
    try:
        await ran(
            ArchiveStore(connection), dataclasses.replace(event, key=route_key(event.key, "billing"), route="billing")
        )
    finally:
        await connection.close()
    page = await open_page(await start_console(WEBHOOK_INGEST_SOURCES=str(sources)))
    await sign_in(page, OPERATOR_TOKEN)
    await page.goto("/console/events/acme:evt_s")
    completed = page.locator("dl.facts dt:text-is('Completed') + dd")
    await expect(completed).to_contain_text(re.compile(r"route billing: \S+ \(attempt 1\); route audit: —"))


async def test_a_bulk_replay_acts_on_exactly_the_frozen_set_at_the_set_pace(start_console, open_page, service_env):
    database, rate = service_env["DATABASE_URL"], 25
    frozen = await seed_dead_letters(database, "acme", 50)
    hidden = await seed_dead_letters(database, "other", 5, start=100)  # the filter hides them
    page = await open_page(await start_console())
    await sign_in(page, OPERATOR_TOKEN)
    await page.goto("/console/dead-letters?source=acme")
    assert await page.evaluate("typeof window.htmx") == "object"  # the vendored script, from the ingress
    await page.get_by_role("button", name="Replay all matching").click()
    await expect(page.get_by_role("status").filter(has_text="open dead letters match")).to_contain_text("50")

    arrived_before_confirm = await seed_dead_letters(database, "acme", 5, start=200)
    await page.get_by_label("Rate (dead letters per second)").fill(str(rate))
    await screenshot(page, "bulk-confirm")
    await page.get_by_role("button", name="Confirm replay of 50").click()
    arrived_during_run = await seed_dead_letters(database, "acme", 3, start=300)
    await expect(page.get_by_text("State: done")).to_be_visible(timeout=60_000)
    await expect(page.locator("#progress")).to_contain_text("50 of 50 replayed, 0 skipped")
    await screenshot(page, "bulk-done")

    after = await statuses(database)
    assert {i for i, s in after.items() if s == "replayed"} == set(frozen)
    assert all(after[i] == "dead" for i in hidden + arrived_before_confirm + arrived_during_run)
    queued = await queued_events(service_env["AMQP_URL"], service_env["WEBHOOK_INGEST_NAMESPACE"])
    assert sorted(event.key for event in queued) == sorted(f"acme:evt_{n}" for n in range(50))
    connection = await asyncpg.connect(database)
    try:
        started, last = await connection.fetchrow(
            "SELECT b.started_at, max(r.replayed_at) FROM console_bulk_actions b"
            " JOIN dead_letter_replays r ON r.bulk_action_id = b.id GROUP BY b.id"
        )
    finally:
        await connection.close()
    assert (last - started).total_seconds() >= (len(frozen) - 1) / rate  # paced: never faster than asked


async def test_a_viewer_sees_no_button_that_changes_anything_and_its_posts_are_refused(
    start_console, open_page, service_env
):
    [dead] = await seed_dead_letters(service_env["DATABASE_URL"], "acme", 1)
    page = await open_page(await start_console())
    await sign_in(page, VIEWER_TOKEN)
    await expect(page.get_by_text("(read only)")).to_be_visible()
    await page.goto("/console/dead-letters")
    await expect(page.locator("table.dead-letters tbody tr")).to_have_count(1)
    await page.goto(f"/console/dead-letters/{dead}")
    await expect(page.get_by_role("heading", name=f"Dead letter {dead}")).to_be_visible()
    every_button = await page.get_by_role("button").all_inner_texts()
    assert every_button == ["Sign out"]
    await screenshot(page, "viewer")

    csrf = await page.locator("input[name=csrf_token]").first.input_value()
    for path in (f"/console/dead-letters/{dead}/replay", f"/console/dead-letters/{dead}/discard", "/console/bulk"):
        response = await page.request.post(path, form={"csrf_token": csrf, "action": "replay"})
        assert response.status == 403, path
        assert "change nothing" in await response.text()
    assert await statuses(service_env["DATABASE_URL"]) == {dead: "dead"}


async def test_a_post_without_the_csrf_token_or_from_another_site_is_refused(start_console, open_page, service_env):
    [dead] = await seed_dead_letters(service_env["DATABASE_URL"], "acme", 1)
    page = await open_page(base := await start_console())
    await sign_in(page, OPERATOR_TOKEN)
    await page.goto(f"/console/dead-letters/{dead}")
    csrf = await page.locator("input[name=csrf_token]").first.input_value()
    replay = f"/console/dead-letters/{dead}/replay"

    for form, headers in (
        ({}, {}),
        ({"csrf_token": "not-the-token"}, {}),
        ({"csrf_token": csrf}, {"Origin": "http://attacker.example"}),
        ({"csrf_token": csrf}, {"Sec-Fetch-Site": "cross-site"}),
    ):
        response = await page.request.post(replay, form=form, headers=headers, max_redirects=0)
        assert response.status == 403, (form, headers)
    assert await statuses(service_env["DATABASE_URL"]) == {dead: "dead"}

    accepted = await page.request.post(replay, form={"csrf_token": csrf}, headers={"Origin": base}, max_redirects=0)
    assert accepted.status == 303
    assert await statuses(service_env["DATABASE_URL"]) == {dead: "replayed"}


async def test_a_wrong_token_never_gets_a_session(start_console, open_page):
    page = await open_page(await start_console())
    for wrong in ("wrong-token", OPERATOR_TOKEN + " ", OPERATOR_TOKEN[:-1]):
        await sign_in(page, wrong)
        await expect(page.get_by_role("alert")).to_have_text("That token is not valid.")
    await page.goto("/console/dead-letters")
    await expect(page).to_have_url(re.compile(r".*/console/login$"))
    await expect(page.get_by_role("button", name="Sign in")).to_be_visible()


async def test_the_session_expires(start_console, open_page):
    page = await open_page(await start_console(WEBHOOK_INGEST_CONSOLE_SESSION_SECONDS="2"))
    await sign_in(page, OPERATOR_TOKEN)
    await expect(page.get_by_role("heading", name="Overview")).to_be_visible()
    cookie = next(c for c in await page.context.cookies() if c["name"] == "webhook_ingest_console")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/console/"
    await asyncio.sleep(2.5)
    await page.goto("/console/dead-letters")
    await expect(page.get_by_text("Your session expired. Sign in again.")).to_be_visible()
    await expect(page.get_by_role("button", name="Sign in")).to_be_visible()


async def test_on_call_sees_each_worker_and_the_last_hour_per_minute(start_console, open_page, service_env):
    """Issue 35, requirement 7: the overview names a silent worker, and its
    chart of the last hour is an image with a name, a description and a table."""
    ids = await seed_workers(service_env["DATABASE_URL"])
    page = await open_page(await start_console())
    await sign_in(page, OPERATOR_TOKEN)

    workers = page.locator("table.workers")
    await expect(workers.get_by_role("row").filter(has_text=ids["silent"])).to_contain_text("silent")
    await expect(workers.get_by_role("row").filter(has_text=ids["degraded"])).to_contain_text("degraded")
    await expect(workers.get_by_role("row").filter(has_text=ids["stopped"])).to_contain_text("stopped")
    chart = page.get_by_role("img", name="Outcomes per minute, last hour (UTC)")
    await expect(chart).to_be_visible()
    await expect(page.locator("#minutes-desc")).to_contain_text("18 dead")
    assert (await chart.bounding_box())["width"] > 600  # drawn, not collapsed
    await page.get_by_text("The same figures as a table").click()
    await expect(page.locator("details.minutes-table tbody tr")).to_have_count(60)
    await page.get_by_text("The same figures as a table").click()
    await screenshot(page, "overview-workers")
