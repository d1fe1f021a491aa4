"""An event's identity comes only from what its signature covers (issue 36, findings 1-5;
docs/reference.md §4-5, docs/security.md "The event archive").

Each case is an attacker who has one signed request (a log, a proxy, the
archive) and sends it again with the unsigned parts changed: a new id
header, a new type header, another Content-Type, the form's fields
reordered. Signed with the providers' own code (standardwebhooks, stripe,
twilio's RequestValidator; GitHub and Shopify publish only the HMAC),
against the real ingress and broker: what must never happen is a second
event, under a new key or a new route, for content that was signed once.
"""

import base64
import hashlib
import hmac
import json
import time
from datetime import UTC, datetime
from urllib.parse import urlencode

import pytest
import standardwebhooks
import stripe
from twilio.request_validator import RequestValidator

from tests.support.ingress import queued_events, running_ingress
from tests.support.signing import PROVIDERS, TWILIO_URL
from tests.support.tcpproxy import free_port
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources
from webhook_ingest.workers.fan_out import route_messages

SVIX_SECRET = PROVIDERS["standard-webhooks"].source_secret
STRIPE_SECRET = PROVIDERS["stripe"].source_secret
GITHUB_SECRET = PROVIDERS["github"].source_secret
SHOPIFY_SECRET = PROVIDERS["shopify"].source_secret
HMAC_SECRET = PROVIDERS["hmac-sha256"].source_secret
TWILIO_TOKEN = PROVIDERS["twilio"].source_secret
FORM = "application/x-www-form-urlencoded"


@pytest.fixture
def sources(tmp_path):
    path = tmp_path / "sources.toml"
    path.write_text(
        f'[sources.svix]\nscheme = "standard-webhooks"\nsecrets = ["{SVIX_SECRET}"]\nhandler = "inbox"\n'
        f'[sources.stripe]\nscheme = "stripe"\nsecrets = ["{STRIPE_SECRET}"]\nhandler = "inbox"\n'
        f'[sources.github]\nscheme = "github"\nsecrets = ["{GITHUB_SECRET}"]\n'
        '[[sources.github.routes]]\nname = "ci"\nhandler = "inbox"\ntypes = ["push"]\n'
        '[[sources.github.routes]]\nname = "triage"\nhandler = "inbox"\ntypes = ["issues"]\n'
        f'[sources.shopify]\nscheme = "shopify"\nsecrets = ["{SHOPIFY_SECRET}"]\nhandler = "inbox"\n'
        f'[sources.twilio]\nscheme = "twilio"\nsecrets = ["{TWILIO_TOKEN}"]\nhandler = "inbox"\n'
        f'public_url = "{TWILIO_URL}"\n'
        f'[sources.generic]\nscheme = "hmac-sha256"\nsecrets = ["{HMAC_SECRET}"]\nhandler = "inbox"\n'
        '[sources.generic.ignore]\ntype = ["ping"]\n'
        f'[sources.routed]\nscheme = "hmac-sha256"\nsecrets = ["{HMAC_SECRET}"]\n'
        '[[sources.routed.routes]]\nname = "billing"\nhandler = "inbox"\ntypes = ["invoice.*"]\n'
        '[[sources.routed.routes]]\nname = "crm"\nhandler = "inbox"\ntypes = ["customer.*"]\n'
    )
    return load_sources(str(path))


def svix_signed(body: bytes, msg_id: str) -> dict[str, str]:
    """What a Svix sender sends: the svix-* names, signed by the standardwebhooks library."""
    now = int(time.time())
    signature = standardwebhooks.Webhook(SVIX_SECRET).sign(msg_id, datetime.fromtimestamp(now, UTC), body.decode())
    return {
        "svix-id": msg_id,
        "svix-timestamp": str(now),
        "svix-signature": signature,
        "Content-Type": "application/json",
    }


def hmac_signed(body: bytes, secret: str, **headers: str) -> dict[str, str]:
    digest = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {"X-Signature": f"sha256={digest}", "Content-Type": "application/json", **headers}


def github_signed(body: bytes, delivery: str, event: str) -> dict[str, str]:
    digest = hmac.new(GITHUB_SECRET.encode(), body, hashlib.sha256).hexdigest()
    return {
        "X-Hub-Signature-256": f"sha256={digest}",
        "X-GitHub-Delivery": delivery,
        "X-GitHub-Event": event,
        "Content-Type": "application/json",
    }


def shopify_signed(body: bytes, webhook_id: str) -> dict[str, str]:
    digest = base64.b64encode(hmac.new(SHOPIFY_SECRET.encode(), body, hashlib.sha256).digest()).decode()
    return {
        "X-Shopify-Hmac-Sha256": digest,
        "X-Shopify-Webhook-Id": webhook_id,
        "X-Shopify-Topic": "orders/create",
        "Content-Type": "application/json",
    }


def twilio_signed(fields: list[tuple[str, str]], token: str) -> tuple[bytes, dict[str, str]]:
    signature = RequestValidator(TWILIO_TOKEN).compute_signature(TWILIO_URL, dict(fields))
    return urlencode(fields).encode(), {
        "X-Twilio-Signature": signature,
        "I-Twilio-Idempotency-Token": token,
        "Content-Type": FORM,
    }


async def answers(client, path: str, requests: list[tuple[bytes, dict[str, str]]]) -> list[tuple[int, dict]]:
    return [
        (response.status, await response.json())
        for response in [await client.post(path, data=body, headers=headers) for body, headers in requests]
    ]


async def queued_keys(settings) -> list[str]:
    return sorted(event.key for event in await queued_events(settings.amqp_url, settings.namespace))


# -- 1. the id ---------------------------------------------------------------------------------------


async def test_a_svix_request_with_an_added_webhook_id_is_the_same_event(settings, sources):
    body = json.dumps({"type": "user.created", "data": {"id": "u_1"}}).encode()
    signed = svix_signed(body, "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W")
    async with running_ingress(settings, sources) as client:
        replies = await answers(
            client,
            "/webhooks/svix",
            [(body, signed)] + [(body, {**signed, "webhook-id": f"forged-{n}"}) for n in range(3)],
        )
    assert {reply["key"] for _, reply in replies} == {"svix:msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"}
    assert set(await queued_keys(settings)) == {"svix:msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"}


async def test_an_hmac_body_with_a_new_x_event_id_is_the_same_event(settings, sources):
    body = json.dumps({"id": "evt_1", "type": "invoice.paid"}).encode()
    async with running_ingress(settings, sources) as client:
        replies = await answers(
            client,
            "/webhooks/generic",
            [
                (body, hmac_signed(body, HMAC_SECRET)),
                (body, hmac_signed(body, HMAC_SECRET, **{"X-Event-ID": "forged"})),
            ],
        )
    assert replies[1][1]["key"] == "generic:evt_1"
    assert set(await queued_keys(settings)) == {"generic:evt_1"}


# -- 2. the type -------------------------------------------------------------------------------------


async def test_an_unsigned_type_header_neither_dodges_an_ignore_rule_nor_picks_a_route(settings, sources):
    ping = json.dumps({"id": "evt_ping", "type": "ping"}).encode()
    customer = json.dumps({"id": "evt_2", "type": "customer.created"}).encode()
    async with running_ingress(settings, sources) as client:
        [(_, ignored)] = await answers(
            client, "/webhooks/generic", [(ping, hmac_signed(ping, HMAC_SECRET, **{"X-Event-Type": "pong"}))]
        )
        [(_, routed)] = await answers(
            client,
            "/webhooks/routed",
            [(customer, hmac_signed(customer, HMAC_SECRET, **{"X-Event-Type": "invoice.paid"}))],
        )
    assert ignored == {"status": "ignored", "key": "generic:evt_ping", "rule": "type=ping"}
    assert routed == {"status": "accepted", "key": "routed:evt_2"}
    [queued] = await queued_events(settings.amqp_url, settings.namespace)
    assert [message.route for message in route_messages(sources["routed"], queued)] == ["crm"]  # the worker's fan-out


async def test_a_github_delivery_sent_again_with_another_event_header_runs_no_other_route(settings, sources):
    body = json.dumps({"ref": "refs/heads/main", "after": "6113728f27ae82c7b1a177c8d03f9e96e0adf246"}).encode()
    async with running_ingress(settings, sources) as client:
        replies = await answers(
            client,
            "/webhooks/github",
            [(body, github_signed(body, "d-1", "push")), (body, github_signed(body, "d-1", "issues"))],
        )
    assert replies == [
        (200, {"status": "accepted", "key": "github:d-1"}),
        (200, {"status": "duplicate", "key": "github:d-1"}),
    ]
    [queued] = await queued_events(settings.amqp_url, settings.namespace)
    assert [message.route for message in route_messages(sources["github"], queued)] == ["ci"]


async def test_a_github_body_resent_with_a_fresh_delivery_and_another_event_is_a_duplicate(settings, sources):
    """GitHub sends one body as one event type: only Shopify documents one
    body under several topics, so only its bindings hold more than one."""
    body = json.dumps({"action": "opened", "issue": {"number": 1347}}).encode()
    async with running_ingress(settings, sources) as client:
        replies = await answers(
            client,
            "/webhooks/github",
            [(body, github_signed(body, "d-1", "issues")), (body, github_signed(body, "d-2", "push"))],
        )
    assert replies == [
        (200, {"status": "accepted", "key": "github:d-1"}),
        (200, {"status": "duplicate", "key": "github:d-1"}),
    ]
    assert await queued_keys(settings) == ["github:d-1"]


# -- 3. the parser -----------------------------------------------------------------------------------


async def test_a_signed_stripe_body_sent_as_a_form_is_still_its_json_event(settings, sources):
    body = json.dumps({"id": "evt_3", "object": "event", "type": "invoice.paid"}).encode()
    signature = stripe.WebhookSignature.generate_signature_header(
        body.decode(), STRIPE_SECRET, timestamp=int(time.time())
    )
    headers = {"Stripe-Signature": signature, "Content-Type": "application/json"}
    async with running_ingress(settings, sources) as client:
        replies = await answers(
            client, "/webhooks/stripe", [(body, headers), (body, {**headers, "Content-Type": FORM})]
        )
    assert [reply["key"] for _, reply in replies] == ["stripe:evt_3", "stripe:evt_3"]
    events = await queued_events(settings.amqp_url, settings.namespace)
    assert {event.key for event in events} == {"stripe:evt_3"}
    assert {event.payload_sha256 for event in events} == {events[0].payload_sha256}  # one payload, not a conflict


# -- 4. schemes whose only id is an unsigned header and that sign no time ----------------------------


async def test_a_signed_body_reposted_with_a_fresh_id_header_is_a_duplicate(settings, sources):
    push = json.dumps({"ref": "refs/heads/main", "after": "b1a177c8"}).encode()
    order = json.dumps({"id": 820982911946154508, "total_price": "254.98"}).encode()
    sms, sms_headers = twilio_signed([("MessageSid", "SM1"), ("Body", "pay 100")], "tok-1")
    async with running_ingress(settings, sources) as client:
        github = await answers(
            client,
            "/webhooks/github",
            [
                (push, github_signed(push, "d-1", "push")),
                (push, github_signed(push, "d-1", "push")),
                (push, github_signed(push, "d-2", "push")),
            ],
        )
        shopify = await answers(
            client, "/webhooks/shopify", [(order, shopify_signed(order, "w-1")), (order, shopify_signed(order, "w-2"))]
        )
        twilio = await answers(
            client,
            "/webhooks/twilio",
            [(sms, sms_headers), (sms, {**sms_headers, "I-Twilio-Idempotency-Token": "tok-2"})],
        )
    assert [reply for _, reply in github] == [{"status": "accepted", "key": "github:d-1"}] * 2 + [
        {"status": "duplicate", "key": "github:d-1"}
    ]  # the provider's own redelivery still goes through
    assert [reply for _, reply in shopify] == [
        {"status": "accepted", "key": "shopify:w-1"},
        {"status": "duplicate", "key": "shopify:w-1"},
    ]
    assert [reply for _, reply in twilio] == [
        {"status": "accepted", "key": "twilio:tok-1"},
        {"status": "duplicate", "key": "twilio:tok-1"},
    ]
    assert await queued_keys(settings) == ["github:d-1", "github:d-1", "shopify:w-1", "twilio:tok-1"]


# -- 5. twilio: one signature, several forms ---------------------------------------------------------


async def test_a_twilio_form_reordered_or_with_a_field_repeated_is_no_new_event(settings, sources):
    fields = [("MessageSid", "SM2"), ("From", "+15005550006"), ("Body", "refund 100")]
    body, headers = twilio_signed(fields, "tok-1")
    reordered = urlencode(list(reversed(fields))).encode()
    repeated = urlencode([*fields, ("Body", "refund 100")]).encode()  # the same signature: Twilio signs the set
    async with running_ingress(settings, sources) as client:
        replies = await answers(
            client,
            "/webhooks/twilio",
            [
                (body, headers),
                (reordered, {**headers, "I-Twilio-Idempotency-Token": "tok-2"}),
                (repeated, {**headers, "I-Twilio-Idempotency-Token": "tok-3"}),
            ],
        )
    assert replies == [
        (200, {"status": "accepted", "key": "twilio:tok-1"}),
        (200, {"status": "duplicate", "key": "twilio:tok-1"}),
        (400, {"error": "invalid_form"}),
    ]  # a field twice with one value: no form Twilio sends
    assert await queued_keys(settings) == ["twilio:tok-1"]


async def test_with_redis_away_a_delivery_whose_id_is_unsigned_is_still_accepted(settings, sources, monkeypatch):
    """The binding cannot be read: the event takes the normal path, never lost (docs/security.md says the cost)."""
    monkeypatch.setenv("REDIS_URLS", f"redis://127.0.0.1:{free_port()}/0")
    push = json.dumps({"ref": "refs/heads/main", "after": "b1a177c8"}).encode()
    async with running_ingress(Settings(), sources) as client:
        replies = await answers(client, "/webhooks/github", [(push, github_signed(push, "d-1", "push"))])
    assert replies == [(200, {"status": "accepted", "key": "github:d-1"})]
    assert await queued_keys(settings) == ["github:d-1"]


# -- a provider's own traffic: one signed body under two topics ---------------------------------------


async def test_shopify_sending_one_body_under_two_topics_is_two_events(settings, sources):
    """Shopify fires products/create and products/update for one API call that creates and publishes a
    product, "even when processed through a single payload" (Shopify API support): the same signed body,
    two webhook ids, two topics. Answered 200 `duplicate`, the second would never be sent again."""
    product = json.dumps({"id": 788032119674292922, "title": "Example T-Shirt", "status": "active"}).encode()
    created = {**shopify_signed(product, "w-create"), "X-Shopify-Topic": "products/create"}
    updated = {**shopify_signed(product, "w-update"), "X-Shopify-Topic": "products/update"}
    async with running_ingress(settings, sources) as client:
        replies = await answers(
            client,
            "/webhooks/shopify",
            [(product, created), (product, updated), (product, {**updated, "X-Shopify-Webhook-Id": "forged"})],
        )
    assert replies == [
        (200, {"status": "accepted", "key": "shopify:w-create"}),
        (200, {"status": "accepted", "key": "shopify:w-update"}),
        (200, {"status": "duplicate", "key": "shopify:w-update"}),
    ]  # a topic it came with: no rerun
    assert await queued_keys(settings) == ["shopify:w-create", "shopify:w-update"]


# -- an ignore rule that reads an unsigned header ------------------------------------------------------


async def test_an_unsigned_header_an_ignore_rule_reads_does_not_make_an_ignored_event_run(settings, tmp_path):
    """GitHub names the hook's owner in X-GitHub-Hook-Installation-Target-Type, signed by nothing. An
    event a rule on it ignored, sent again under its own delivery id and type with that header changed,
    must not run: the operator said it should not, and its signed content was answered once."""
    path = tmp_path / "sources.toml"
    path.write_text(
        f'[sources.github]\nscheme = "github"\nsecrets = ["{GITHUB_SECRET}"]\nhandler = "inbox"\n'
        '[sources.github.ignore]\n"header:X-GitHub-Hook-Installation-Target-Type" = ["organization"]\n'
    )
    sources = load_sources(str(path))
    body = json.dumps({"action": "member_added", "membership": {"role": "admin"}}).encode()

    def sent(target: str) -> dict[str, str]:
        return {**github_signed(body, "d-7", "organization"), "X-GitHub-Hook-Installation-Target-Type": target}

    async with running_ingress(settings, sources) as client:
        replies = await answers(client, "/webhooks/github", [(body, sent("organization")), (body, sent("repository"))])
    assert replies[0] == (
        200,
        {
            "status": "ignored",
            "key": "github:d-7",
            "rule": "header:X-GitHub-Hook-Installation-Target-Type=organization",
        },
    )
    assert replies[1] == (200, {"status": "duplicate", "key": "github:d-7"})
    assert await queued_keys(settings) == []


# -- twilio without an idempotency token: the content hash of one of several forms ---------------------


async def test_a_twilio_form_with_a_name_value_boundary_moved_is_no_new_event(settings, sources):
    """Twilio signs URL + name + value + name + value…: `Body=pay 100` and `Bodyp=ay 100` sign the same. A
    request without I-Twilio-Idempotency-Token is keyed by its content hash (reference §5), so the form with
    the boundary moved would be a new key, its handler given a field that was never sent."""
    fields = [("MessageSid", "SM3"), ("Body", "pay 100"), ("From", "+15005550006")]
    body, headers = twilio_signed(fields, "unused")
    del headers["I-Twilio-Idempotency-Token"]
    shifted = urlencode([("MessageSid", "SM3"), ("Bodyp", "ay 100"), ("From", "+15005550006")]).encode()
    async with running_ingress(settings, sources) as client:
        replies = await answers(client, "/webhooks/twilio", [(body, headers), (shifted, headers)])
    assert replies[0][1]["status"] == "accepted"
    assert replies[1] == (200, {"status": "duplicate", "key": replies[0][1]["key"]})
    assert len(await queued_keys(settings)) == 1
