"""The schemes of issue 23 through a real ingress (docs/reference.md §4, §6): a signed request
(under the new secret and the one being rotated out) is 200 and queued verbatim; a wrong or
missing one is 401 and queues nothing; url-encoded forms reach the handler decoded."""

import json
import time
from urllib.parse import urlencode

import asyncpg
import pytest

from tests.support.exactly_once import until_completed
from tests.support.ingress import queued_events, running_ingress
from tests.support.signing import PROVIDERS, SQUARE_URL, TWILIO_URL, ed25519_pair
from webhook_ingest.shared import signatures
from webhook_ingest.shared.event import payloads
from webhook_ingest.shared.signatures import twilio
from webhook_ingest.shared.sources.model import load_sources

SCHEMES = ["standard-webhooks-v1a", "slack", "gitlab", "twilio", "square", "basic-auth", "api-key"]
JSON = "application/json"
FORM = payloads.FORM
ID_HEADERS = {
    "gitlab": "Idempotency-Key",
    "twilio": "I-Twilio-Idempotency-Token",
    "basic-auth": "X-Event-ID",
    "api-key": "X-Event-ID",
}  # v1a: webhook-id; slack and square: the body's event_id
WRONG_SIGNERS = {"standard-webhooks-v1a": ed25519_pair(9)[0], "basic-auth": "hooks:wrong"}
CREDENTIAL_HEADERS = {"gitlab": "x-gitlab-token", "api-key": "x-api-key", "basic-auth": "authorization"}


def sources_file(path) -> str:
    sections = []
    for scheme in SCHEMES:
        provider = PROVIDERS[scheme]
        options = "".join(f'{name} = "{value}"\n' for name, value in provider.options.items())
        sections.append(
            f'[sources.{scheme}]\nscheme = "{scheme}"\nhandler = "inbox"\n'
            f'secrets = ["{provider.old_source_secret}", "{provider.source_secret}"]\n{options}'
        )
    path.write_text("\n".join(sections))
    return str(path)


@pytest.fixture
def sources(tmp_path):
    return load_sources(sources_file(tmp_path / "sources.toml"))


def signed(
    scheme: str,
    body: bytes,
    event_id: str,
    signer: str | None = None,
    content_type: str = JSON,
    timestamp: int | None = None,
) -> tuple[str, dict[str, str]]:
    """(path with query, headers) as the provider would send them."""
    provider = PROVIDERS[scheme]
    query = twilio.body_hash_query(body) if scheme == "twilio" and content_type == JSON else ""
    headers = signatures.sign(
        scheme,
        body,
        signer or provider.signer,
        msg_id=event_id,
        timestamp=timestamp,
        query_string=query,
        content_type=content_type,
        **provider.options,
    )
    if scheme in ID_HEADERS:
        headers[ID_HEADERS[scheme]] = event_id
    return f"/webhooks/{scheme}" + (f"?{query}" if query else ""), {**headers, "Content-Type": content_type}


def json_body(event_id: str) -> bytes:
    return json.dumps({"id": event_id, "event_id": event_id, "type": "test.event"}).encode()


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_signed_under_either_secret_is_accepted_and_queued_verbatim(settings, sources, scheme):
    provider = PROVIDERS[scheme]
    sent = {}
    async with running_ingress(settings, sources) as client:
        for n, signer in enumerate((provider.old_signer, provider.signer)):
            body = json_body(f"evt_{n}")
            path, headers = signed(scheme, body, f"evt_{n}", signer)
            response = await client.post(path, data=body, headers=headers)
            assert (response.status, await response.json()) == (200, {"status": "accepted", "key": f"{scheme}:evt_{n}"})
            sent[f"{scheme}:evt_{n}"] = body
    events = await queued_events(settings.amqp_url, settings.namespace)
    assert {event.key: event.body for event in events} == sent
    assert all(CREDENTIAL_HEADERS.get(scheme, "-") not in event.headers for event in events)  # never handed on


@pytest.mark.parametrize("scheme", SCHEMES)
async def test_a_wrong_or_missing_signature_is_401_and_queues_nothing(settings, sources, scheme):
    body = json_body("evt_1")
    path, good = signed(scheme, body, "evt_1")
    _, wrong = signed(scheme, body, "evt_1", WRONG_SIGNERS.get(scheme, "not-the-secret"))
    unsigned = {name: value for name, value in good.items() if name not in wrong or good[name] == wrong[name]}
    async with running_ingress(settings, sources) as client:
        for headers, code in ((wrong, "invalid_signature"), (unsigned, "missing_signature")):
            response = await client.post(path, data=body, headers=headers)
            assert (response.status, await response.json()) == (401, {"error": code}), headers
            if scheme == "basic-auth":
                assert response.headers["WWW-Authenticate"].startswith("Basic realm=")
        response = await client.post(path, data=body + b" ", headers=good)  # the body changed after signing
        assert response.status == (200 if scheme in CREDENTIAL_HEADERS else 401)
    queued = await queued_events(settings.amqp_url, settings.namespace)
    assert len(queued) == (1 if scheme in CREDENTIAL_HEADERS else 0)  # a credential says nothing of the body


@pytest.mark.parametrize("scheme", ["standard-webhooks-v1a", "slack"])
async def test_a_stale_timestamp_is_refused(settings, sources, scheme):
    body = json_body("evt_1")
    async with running_ingress(settings, sources) as client:
        path, headers = signed(scheme, body, "evt_1", timestamp=int(time.time()) - 301)
        response = await client.post(path, data=body, headers=headers)
        assert (response.status, await response.json()) == (401, {"error": "stale_timestamp"})


SMS = [
    ("MessageSid", "SM1234567890abcdef"),
    ("From", "+15005550006"),
    ("To", "+15005550001"),
    ("Body", "Hello & goodbye = 100%"),
    ("FromCity", ""),
    ("MediaUrl0", "https://a/1"),
    ("MediaUrl0", "https://a/2"),
]


async def test_a_twilio_form_is_accepted_and_keyed_by_its_idempotency_token(settings, sources):
    body = urlencode(SMS).encode()
    path, headers = signed("twilio", body, "token-1", content_type=FORM)
    async with running_ingress(settings, sources) as client:
        response = await client.post(path, data=body, headers=headers)
        assert (response.status, await response.json()) == (200, {"status": "accepted", "key": "twilio:token-1"})
    [event] = await queued_events(settings.amqp_url, settings.namespace)
    assert event.body == body and payloads.is_form(event.headers["content-type"])


async def test_a_slack_slash_command_is_keyed_by_its_trigger_id(settings, sources):
    body = b"token=x&command=%2Fdeploy&text=prod&trigger_id=13345224609.738474920.8088930838d88f008e0"
    path, headers = signed("slack", body, "-", content_type=FORM)
    async with running_ingress(settings, sources) as client:
        response = await client.post(path, data=body, headers=headers)
        answer = await response.json()
    assert (response.status, answer["key"]) == (200, "slack:13345224609.738474920.8088930838d88f008e0")


async def test_a_form_that_does_not_decode_is_400_invalid_form(settings, sources):
    body = b"note=%FF%FE&zero=%00"
    path, headers = signed("gitlab", body, "evt_1", content_type=FORM)
    async with running_ingress(settings, sources) as client:
        response = await client.post(path, data=body, headers=headers)
        assert (response.status, await response.json()) == (400, {"error": "invalid_form"})
        twilio_headers = {"X-Twilio-Signature": "c2lnbmVk", "Content-Type": FORM}  # twilio decodes it to verify it
        response = await client.post("/webhooks/twilio", data=body, headers=twilio_headers)
        assert (response.status, await response.json()) == (401, {"error": "invalid_signature"})
    assert await queued_events(settings.amqp_url, settings.namespace) == []


async def test_twilio_json_with_body_sha256_and_square_behind_a_proxy(settings, sources):
    # The test client posts to 127.0.0.1:<port>; the signatures are over the public URLs of the sources file.
    assert TWILIO_URL.startswith("https://hooks.example.com") and SQUARE_URL.startswith("https://hooks.example.com")
    async with running_ingress(settings, sources) as client:
        for scheme in ("twilio", "square"):
            body = json_body("evt_7")
            path, headers = signed(scheme, body, "evt_7")
            response = await client.post(path, data=body, headers=headers)
            assert response.status == 200, scheme
        response = await client.post("/webhooks/twilio", data=body, headers=headers)  # no bodySHA256
        assert response.status == 401


async def test_a_form_reaches_the_inbox_as_its_decoded_fields(settings, sources, fleet, tmp_path):
    body = urlencode(SMS).encode()
    path, headers = signed("twilio", body, "token-9", content_type=FORM)
    async with running_ingress(settings, sources) as client:
        assert (await client.post(path, data=body, headers=headers)).status == 200
    fleet.worker("--concurrency", "2", env={"WEBHOOK_INGEST_SOURCES": sources_file(tmp_path / "worker.toml")})
    await until_completed(settings.database_url, 1)
    connection = await asyncpg.connect(settings.database_url)
    try:
        stored = await connection.fetchval("SELECT payload::text FROM inbox WHERE key = 'twilio:token-9'")
    finally:
        await connection.close()
    assert json.loads(stored) == {
        "MessageSid": "SM1234567890abcdef",
        "From": "+15005550006",
        "To": "+15005550001",
        "Body": "Hello & goodbye = 100%",
        "FromCity": "",
        "MediaUrl0": ["https://a/1", "https://a/2"],
    }


async def test_slacks_url_verification_is_answered_with_its_challenge_and_not_queued(settings, sources):
    """Slack's Events API checks a new Request URL with a signed
    url_verification and enables it only if the challenge comes back."""
    body = json.dumps(
        {"token": "x", "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P", "type": "url_verification"}
    ).encode()
    path, headers = signed("slack", body, "-")
    async with running_ingress(settings, sources) as client:
        response = await client.post(path, data=body, headers=headers)
        assert (response.status, await response.json()) == (
            200,
            {"challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"},
        )
        unsigned = await client.post(path, data=body, headers={"Content-Type": JSON})
        assert unsigned.status == 401
    assert await queued_events(settings.amqp_url, settings.namespace) == []
