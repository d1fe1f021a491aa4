"""shared/event/payloads at the ingress: a form of more fields than any
provider sends is refused before it is parsed, signed or not (issue 21)."""

import base64
import hashlib
import hmac
from urllib.parse import urlencode

import pytest

from tests.support.ingress import running_ingress
from tests.support.preauth import preauth_sources, settings_with
from tests.support.signing import PROVIDERS, TWILIO_URL
from webhook_ingest.shared.event import payloads
from webhook_ingest.shared.signatures import twilio

MAX_FORM_FIELDS = payloads.MAX_FORM_FIELDS


@pytest.fixture
def sources(tmp_path):
    return preauth_sources(tmp_path)


async def test_a_form_of_more_fields_than_any_provider_sends_is_refused_unparsed(settings, sources, monkeypatch):
    """twilio signs the decoded fields, so its verifier parses (and sorts) the
    form before any HMAC: 1 MiB of `a=&` took ~0.45 s of the event loop per
    unsigned request (an HMAC over it ~1 ms). Over MAX_FORM_FIELDS a form
    is refused before it is parsed — here even a correctly signed one."""
    fields = [("MessageSid", "SM1"), *((f"f{n}", "") for n in range(MAX_FORM_FIELDS))]
    async with running_ingress(settings_with(monkeypatch), sources) as client:
        over = await client.post("/webhooks/twilio", data=urlencode(fields), headers=twilio_signed(fields))
        assert (over.status, await over.json()) == (401, {"error": "invalid_signature"})
        fitting = fields[:MAX_FORM_FIELDS]
        assert (
            await client.post("/webhooks/twilio", data=urlencode(fitting), headers=twilio_signed(fitting))
        ).status == 200


def twilio_signed(fields: list[tuple[str, str]]) -> dict[str, str]:
    """Twilio's headers for a form of distinct names, signed by hand (`sign` parses the form, and refuses this one)."""
    signed_text = TWILIO_URL.encode() + twilio.signed_fields(dict(fields))
    digest = hmac.new(PROVIDERS["twilio"].source_secret.encode(), signed_text, hashlib.sha1).digest()
    return {"X-Twilio-Signature": base64.b64encode(digest).decode(), "Content-Type": payloads.FORM}
