"""The console's replay of an Events search (issue 22, item 5) in a real
headless Chromium against a real `webhook-ingest ingress` process: the
count first (frozen), confirm with a rate, the progress to done, and a
second replay cancelled. The browser fixtures are test_console.py's."""

from datetime import timedelta

import pytest
from playwright.async_api import expect

from tests.acceptance import test_console as console
from tests.acceptance.test_console import OPERATOR_TOKEN, screenshot, sign_in
from tests.support.archive import archived_event, minutes_ago, seed_archive
from tests.support.ingress import queued_events

pytestmark = pytest.mark.browser
browser, open_page, start_console = console.browser, console.open_page, console.start_console  # its fixtures


async def test_an_events_search_is_counted_frozen_confirmed_and_replayed_then_another_cancelled(
    start_console, open_page, service_env
):
    start = minutes_ago(30)
    await seed_archive(
        service_env["DATABASE_URL"],
        [
            *(archived_event("stripe", f"evt_{n}", start + timedelta(seconds=n), "invoice.paid") for n in range(30)),
            archived_event("stripe", "evt_other", start, "invoice.created"),
        ],
    )
    page = await open_page(await start_console())
    await sign_in(page, OPERATOR_TOKEN)
    await page.goto("/console/events?source=stripe&type=invoice.paid")
    await page.get_by_role("button", name="Replay the events this search matches…").click()
    await expect(page.get_by_role("status").filter(has_text="events match, frozen now")).to_contain_text("30")
    await seed_archive(
        service_env["DATABASE_URL"], [archived_event("stripe", "evt_late", minutes_ago(1), "invoice.paid")]
    )
    await page.get_by_label("Rate (events per second)").fill("50")
    await screenshot(page, "event-replay-confirm")
    await page.get_by_role("button", name="Confirm replay of 30").click()
    await expect(page.get_by_text("State: done")).to_be_visible(timeout=60_000)
    await expect(page.locator("#progress")).to_contain_text("30 of 30 published, 0 skipped")
    replay_id = page.url.rsplit("/", 1)[1]
    queued = await queued_events(service_env["AMQP_URL"], service_env["WEBHOOK_INGEST_NAMESPACE"])
    assert sorted(event.key for event in queued) == sorted(f"replay-{replay_id}/stripe:evt_{n}" for n in range(30))

    await page.goto("/console/events?source=stripe&type=invoice.paid")
    await page.get_by_role("button", name="Replay the events this search matches…").click()
    await expect(page.get_by_role("status").filter(has_text="events match, frozen now")).to_contain_text("31")
    await page.get_by_label("Rate (events per second)").fill("0.2")
    await page.get_by_role("button", name="Confirm replay of 31").click()
    await expect(page.get_by_text("State: running")).to_be_visible()
    await page.get_by_role("button", name="Cancel").click()
    await expect(page.get_by_text("State: cancelled")).to_be_visible()
    await expect(page.get_by_text("Cancelled: what was published stays published.")).to_be_visible()
