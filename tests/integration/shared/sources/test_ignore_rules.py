"""A source's `ignore` rules at the real ingress (docs/reference.md §3, §6):
a verified event a rule matches is answered 200 `ignored` naming the rule,
archived as ignored, counted, and never queued; one no rule matches is
accepted as ever; and no rule is looked at before the signature verified.
Real ingress app, RabbitMQ, Redis and Postgres; no worker runs."""

import json
import re

import asyncpg
import pytest

from tests.support.ingress import queued_events, running_ingress
from tests.support.processes import wait_until
from tests.support.signing import PROVIDER_SECRETS
from webhook_ingest.shared import signatures
from webhook_ingest.shared.sources.model import load_sources

SECRET = PROVIDER_SECRETS["stripe"]
IGNORED_LINE = re.compile(r'^webhook_ingress_ignored_total\{rule="(?P<rule>[^"]*)",source="stripe"\} (?P<n>\S+)$', re.M)


@pytest.fixture
def sources(tmp_path):
    path = tmp_path / "sources.toml"
    path.write_text(
        f'[sources.stripe]\nscheme = "stripe"\nsecrets = ["{SECRET}"]\nhandler = "inbox"\n'
        '[sources.stripe.ignore]\ntype = ["ping", "customer.*"]\n"body:data.object.livemode" = [false]\n'
    )
    return load_sources(str(path))


def stripe_event(event_id: str, type_: str, livemode: bool = True) -> tuple[bytes, dict]:
    body = json.dumps({"id": event_id, "type": type_, "data": {"object": {"livemode": livemode}}}).encode()
    return body, signatures.sign("stripe", body, SECRET)


async def ignored_counts(client) -> dict[str, float]:
    text = await (await client.get("/metrics")).text()
    return {match["rule"]: float(match["n"]) for match in IGNORED_LINE.finditer(text)}


async def archived(database_url: str, count: int) -> list[asyncpg.Record]:
    async def rows():
        connection = await asyncpg.connect(database_url)
        try:
            found = await connection.fetch("SELECT * FROM event_archive ORDER BY event_id")
        finally:
            await connection.close()
        return found if len(found) >= count else None

    return await wait_until(rows, 30, message=f"{count} archived arrivals")


async def test_an_event_a_rule_matches_is_answered_ignored_archived_counted_and_never_queued(settings, sources):
    sent = [
        stripe_event("evt_1", "ping"),
        stripe_event("evt_2", "customer.created"),
        stripe_event("evt_3", "invoice.paid", livemode=False),
    ]
    async with running_ingress(settings, sources) as client:
        before = await ignored_counts(client)
        answers = []
        for body, headers in sent:
            response = await client.post("/webhooks/stripe", data=body, headers=headers)
            answers.append((response.status, await response.json()))
        after = await ignored_counts(client)
        rows = await archived(settings.database_url, 3)
    rules = ["type=ping", "type=customer.*", "body:data.object.livemode=false"]
    assert answers == [
        (200, {"status": "ignored", "key": f"stripe:evt_{n}", "rule": rule}) for n, rule in enumerate(rules, start=1)
    ]
    assert await queued_events(settings.amqp_url, settings.namespace) == []
    assert {rule: after[rule] - before.get(rule, 0) for rule in rules} == dict.fromkeys(rules, 1)
    assert [(row["key"], row["status"], row["ignore_rule"]) for row in rows] == [
        (f"stripe:evt_{n}", "ignored", rule) for n, rule in enumerate(rules, start=1)
    ]
    assert bytes(rows[0]["body"]) == sent[0][0] and rows[0]["event_type"] == "ping"


async def test_an_event_no_rule_matches_is_accepted_and_queued(settings, sources):
    body, headers = stripe_event("evt_9", "invoice.paid", livemode=True)
    async with running_ingress(settings, sources) as client:
        response = await client.post("/webhooks/stripe", data=body, headers=headers)
        answer = await response.json()
    assert (response.status, answer) == (200, {"status": "accepted", "key": "stripe:evt_9"})
    assert [event.key for event in await queued_events(settings.amqp_url, settings.namespace)] == ["stripe:evt_9"]


async def test_an_event_a_rule_matches_still_needs_its_signature(settings, sources):
    body, _headers = stripe_event("evt_1", "ping")
    forged = signatures.sign("stripe", body, "whsec_not_the_secret")
    async with running_ingress(settings, sources) as client:
        before = await ignored_counts(client)
        unsigned = await client.post("/webhooks/stripe", data=body)
        wrong = await client.post("/webhooks/stripe", data=body, headers=forged)
        answers = [(unsigned.status, await unsigned.json()), (wrong.status, await wrong.json())]
        after = await ignored_counts(client)
    assert answers == [(401, {"error": "missing_signature"}), (401, {"error": "invalid_signature"})]
    assert after == before
    assert await queued_events(settings.amqp_url, settings.namespace) == []
