"""`webhook-ingest send-test`: sign a sample event as the provider would, send it."""

import asyncio
import time
import uuid

import aiohttp
import orjson

from webhook_ingest.shared import signatures
from webhook_ingest.shared.sources import Source

# Headers that carry the event id for schemes whose default selector reads a header.
_ID_HEADERS = {
    "github": "X-GitHub-Delivery",
    "shopify": "X-Shopify-Webhook-Id",
    "hmac-sha256": "X-Event-ID",
}


def sample_body(source: Source) -> bytes:
    unique = uuid.uuid4().hex[:16]
    document: dict[str, object]
    if source.scheme == "paystack":
        data = {"id": int(time.time() * 1000), "reference": f"ref_{unique}", "amount": 5000}
        document = {"event": "charge.success", "data": data}
    else:
        document = {"id": f"evt_{unique}", "type": "test.event", "created": int(time.time()),
                    "data": {"message": "hello from send-test"}}
    return orjson.dumps(document)


def signed_request(source: Source, body: bytes) -> dict[str, str]:
    headers = signatures.sign(source.scheme, body, source.secrets[0], signature_header=source.signature_header)
    if source.scheme in _ID_HEADERS:
        headers[_ID_HEADERS[source.scheme]] = str(uuid.uuid4())
    headers["Content-Type"] = "application/json"
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
