"""Running the real ingress app in a test, and reading back what it queued."""

import asyncio
import contextlib
import re

import aio_pika
from aiohttp.test_utils import TestClient, TestServer

from webhook_ingest.ingress.app import create_app
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.event.message import EventMessage, from_amqp


@contextlib.asynccontextmanager
async def running_ingress(settings, sources, wait_ready: bool = True):
    client = TestClient(TestServer(create_app(settings, sources, connection_name="test-ingress")))
    await client.start_server()
    try:
        if wait_ready:
            await wait_until_ready(client)
        yield client
    finally:
        await client.close()


async def wait_until_ready(client: TestClient, timeout: float = 15.0) -> None:
    """Until the broker confirms (/readyz is 200 through the outbox before that)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        response = await client.get("/readyz")
        if response.status == 200 and (await response.json())["via"] == "broker":
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the ingress never became ready")


async def console_login(client: TestClient, token: str) -> None:
    """Logs the client in to the console with `token` (its session cookie kept)."""
    login = await (await client.get("/console/login")).text()
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', login)[1]
    await client.post("/console/login", data={"csrf_token": csrf, "token": token})


async def status_lines_once_answered(readers: list[asyncio.StreamReader], answered: int) -> list[bytes | None]:
    """Each connection's status line, once `answered` of them have one (None:
    still waiting then). Slow bodies are answered PROMPT_BODY_SECONDS after
    they began, so a test waits for the answers instead of guessing a time."""
    lines = [asyncio.ensure_future(reader.readuntil(b"\r\n")) for reader in readers]
    try:
        while sum(line.done() for line in lines) < answered:
            await asyncio.wait([line for line in lines if not line.done()], return_when=asyncio.FIRST_COMPLETED)
        return [line.result().strip() if line.done() else None for line in lines]
    finally:
        for line in lines:
            line.cancel()


async def queued_events(amqp_url: str, namespace: str) -> list[EventMessage]:
    """Everything on the events queue, taken off it."""
    connection = await aio_pika.connect(amqp_url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.get_queue(topology.events_queue(namespace), ensure=False)
        events = []
        while (message := await queue.get(no_ack=True, fail=False)) is not None:
            events.append(from_amqp(message.body, message.headers))
        return events
