"""`webhook-ingest send-test`: sign a sample event as the provider would, send it."""

import asyncio
import time
import uuid
from urllib.parse import urlencode

import aiohttp
import orjson

from webhook_ingest.shared import signatures
from webhook_ingest.shared.errors import ConfigError
from webhook_ingest.shared.event import payloads
from webhook_ingest.shared.sources import Source

# Headers that carry the event id for schemes whose default selector reads a header (hmac-sha256,
# basic-auth and api-key read the sample body's `id` first).
_ID_HEADERS = {
    "github": "X-GitHub-Delivery",
    "shopify": "X-Shopify-Webhook-Id",
    "gitlab": "Idempotency-Key",
    "twilio": "I-Twilio-Idempotency-Token",
}


def sample_body(source: Source) -> bytes:
    unique = uuid.uuid4().hex[:16]
    document: dict[str, object]
    if source.scheme == "paystack":
        data = {"id": int(time.time() * 1000), "reference": f"ref_{unique}", "amount": 5000}
        document = {"event": "charge.success", "data": data}
    elif source.scheme == "twilio":  # an incoming SMS, as Twilio posts it
        return urlencode({"MessageSid": f"SM{unique}", "From": "+15005550006", "Body": "hello from send-test"}).encode()
    else:
        document = {
            "id": f"evt_{unique}",
            "event_id": f"evt_{unique}",
            "type": "test.event",
            "created": int(time.time()),
            "data": {"message": "hello from send-test"},
        }
    return orjson.dumps(document)


def signed_request(source: Source, body: bytes) -> dict[str, str]:
    if source.scheme == "standard-webhooks-v1a":
        raise ConfigError(
            f"send-test cannot sign for source {source.name!r}: a standard-webhooks-v1a source lists"
            " public keys only, the private key stays with the sender"
        )
    content_type = payloads.FORM if source.scheme == "twilio" else "application/json"  # twilio: as sample_body
    headers = signatures.sign(
        source.scheme,
        body,
        source.secrets[0],
        signature_header=source.signature_header,
        public_url=source.public_url,
        content_type=content_type,
    )
    if source.scheme in _ID_HEADERS:
        headers[_ID_HEADERS[source.scheme]] = str(uuid.uuid4())
    headers["Content-Type"] = content_type
    return headers


async def send_test(source: Source, base_url: str, duplicates: int) -> list[tuple[int, str]]:
    """Sends the event once plus `duplicates` identical copies, concurrently."""
    body = sample_body(source)
    headers = signed_request(source, body)
    url = f"{base_url.rstrip('/')}/webhooks/{source.name}"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:

        async def post() -> tuple[int, str]:
            async with session.post(url, data=body, headers=headers) as response:
                return response.status, await response.text()

        return await asyncio.gather(*(post() for _ in range(1 + duplicates)))
