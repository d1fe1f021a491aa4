"""Sends the plan's requests at their planned times through an ingress, as
a provider would (signed, a 503 retried a few times), and keeps what came
back: which keys were accepted, with which payloads, and what was refused.
"""

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp

from tests.chaos.plan import Request
from webhook_ingest.shared import signatures

PROVIDER_RETRIES = 3


@dataclass
class Sent:
    statuses: Counter = field(default_factory=Counter)
    accepted: dict[str, str] = field(default_factory=dict)  # event id -> key
    accepted_variants: dict[str, set[int]] = field(default_factory=dict)  # event id -> payload variants
    answers: dict[str, Counter] = field(default_factory=dict)  # event id -> "200 accepted", "400 invalid_json"…


async def send_all(base_url: str, source: str, secret: str, requests: list[Request], connections: int = 32) -> Sent:
    sent = Sent()
    limit = asyncio.Semaphore(connections)
    started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connections), timeout=timeout) as session:

        async def one(request: Request) -> None:
            await asyncio.sleep(max(0.0, started + request.at - time.monotonic()))
            async with limit:
                await _post(session, f"{base_url}/webhooks/{source}", secret, request, sent)

        await asyncio.gather(*(one(request) for request in requests))
    return sent


async def _post(session, url: str, secret: str, request: Request, sent: Sent) -> None:
    for attempt in range(PROVIDER_RETRIES + 1):
        headers = signatures.sign("hmac-sha256", request.body, secret) | {"Content-Type": "application/json"}
        try:
            async with session.post(url, data=request.body, headers=headers) as response:
                status, body = response.status, await response.json(content_type=None)
        except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
            status, body = 0, {"error": type(exc).__name__}
        if status not in (0, 503) or attempt == PROVIDER_RETRIES:
            break
        await asyncio.sleep(0.5 * (attempt + 1))
    record_answer(sent, request, status, body)


def record_answer(sent: Sent, request: Request, status: int, body: dict) -> None:
    answer = f"{status} {body.get('status') or body.get('error')}"
    sent.statuses[answer] += 1
    sent.answers.setdefault(request.event_id, Counter())[answer] += 1
    if status == 200:
        sent.accepted[request.event_id] = body["key"]
        sent.accepted_variants.setdefault(request.event_id, set()).add(request.variant)
