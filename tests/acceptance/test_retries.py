"""Retries, dead letters and poison messages with real worker processes (docs/reference.md §8).

A local aiohttp server stands in for the receiver of the `forward` handler;
it records every request it gets, so the test counts deliveries and reads
their spacing and their `Idempotency-Key`.
"""

import asyncio
import contextlib
import itertools
import json
import os
import sys
import time

import aio_pika
import aiohttp
import asyncpg
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from tests.support.events import make_event, publish_events
from tests.support.processes import count_rows, wait_until
from tests.support.tcpproxy import free_port
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.sources.model import load_sources
from webhook_ingest.workers.claim.retry import FailurePolicy

pytestmark = pytest.mark.slow

RETRY_DELAYS = [1, 1]
TIMING_TOLERANCE = 0.15  # seconds: timer and clock granularity, never an upper bound


class Receiver:
    """An HTTP endpoint answering `status`, recording (time, headers, body) of each request."""

    def __init__(self, status: int):
        self.status = status
        self.requests: list[tuple[float, dict, bytes]] = []
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"

    async def _hook(self, request: web.Request) -> web.Response:
        self.requests.append((time.monotonic(), dict(request.headers), await request.read()))
        return web.Response(status=self.status, text=str(self.status))

    @contextlib.asynccontextmanager
    async def running(self):
        app = web.Application()
        app.router.add_post("/hook", self._hook)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        try:
            yield self
        finally:
            await runner.cleanup()


def write_sources(path, url: str, max_attempts: int = 3, handler: str = "forward") -> str:
    options = f'handler_options = {{ url = "{url}", timeout_seconds = 5 }}\n' if handler == "forward" else ""
    path.write_text(
        "[sources.acme]\n"
        'scheme = "hmac-sha256"\n'
        'secrets = ["acme-secret"]\n'
        f'handler = "{handler}"\n'
        f"max_attempts = {max_attempts}\n"
        f"retry_delays = {json.dumps(RETRY_DELAYS)}\n" + options
    )
    return str(path)


async def webhook_ingest(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "webhook_ingest",
        *args,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 60)
    return process.returncode, stdout.decode(), stderr.decode()


async def dlq_json(env: dict[str, str], *args: str):
    code, stdout, stderr = await webhook_ingest(env, "dlq", *args, "--json")
    assert code == 0, stderr
    return json.loads(stdout)


async def test_retries_spaced_by_the_delays_then_a_dead_letter_then_one_delivery_on_replay(
    service_env, settings, fleet, tmp_path
):
    receiver = Receiver(500)
    env = {**service_env, "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "sources.toml", receiver.url)}
    event = make_event("acme", "evt_retry")
    metrics_port = free_port()
    async with receiver.running():
        fleet.worker("--concurrency", "4", "--metrics-port", str(metrics_port), env=env)
        await publish_events(settings.amqp_url, settings.namespace, [event])
        await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 60, message="a dead letter")
        outcomes = await wait_until(_outcomes(metrics_port, {"retried": 2, "dead": 1}), 10, message="metrics")
        assert outcomes.get("processed", 0) == 0

        assert len(receiver.requests) == 3  # max_attempts
        assert {headers["Idempotency-Key"] for _, headers, _ in receiver.requests} == {event.key}
        assert all(body == event.body for _, _, body in receiver.requests)
        times = [at for at, _, _ in receiver.requests]
        for delay, (earlier, later) in zip(RETRY_DELAYS, itertools.pairwise(times)):
            assert later - earlier >= delay - TIMING_TOLERANCE

        [listed] = await dlq_json(env, "list")
        assert (listed["key"], listed["source"], listed["status"], listed["attempts"]) == (event.key, "acme", "dead", 3)
        assert listed["last_error"] == f"ForwardFailed: {receiver.url} answered 500"
        shown = await dlq_json(env, "show", str(listed["id"]))
        assert [error["attempt"] for error in shown["errors"]] == [1, 2, 3]
        assert {error["type"] for error in shown["errors"]} == {"ForwardFailed"}
        assert shown["payload"] == json.loads(event.body)
        assert shown["headers"] == event.headers

        receiver.status = 200
        code, stdout, stderr = await webhook_ingest(env, "dlq", "replay", str(listed["id"]))
        assert code == 0, stderr
        assert stdout.strip() == f"replayed 1: {listed['id']}"
        await wait_until(lambda: count_rows(settings.database_url, "processed_events"), 30, message="completion")
        await asyncio.sleep(1.5)  # room for a wrong second delivery to show up

    assert len(receiver.requests) == 4  # three failures, one delivery
    assert receiver.requests[-1][1]["Idempotency-Key"] == event.key
    [replayed] = await dlq_json(env, "list", "--status", "replayed")
    assert replayed["id"] == listed["id"]
    assert await dlq_json(env, "list") == []


def _outcomes(port: int, expected: dict[str, float]):
    """A predicate: the worker's webhook_events_total by outcome, once it shows `expected`."""

    async def check():
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as response:
            text = await response.text()
        counts = {
            sample.labels["outcome"]: sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "webhook_events"
            for sample in family.samples
            if sample.name == "webhook_events_total"
        }
        return counts if all(counts.get(name) == value for name, value in expected.items()) else None

    return check


async def test_a_4xx_answer_is_a_dead_letter_after_one_attempt(service_env, settings, fleet, tmp_path):
    receiver = Receiver(400)
    env = {**service_env, "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "sources.toml", receiver.url)}
    async with receiver.running():
        fleet.worker(env=env)
        await publish_events(settings.amqp_url, settings.namespace, [make_event("acme", "evt_400")])
        await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 60, message="a dead letter")
        await asyncio.sleep(1.5)  # a wrong retry would come back after 1 s

    assert len(receiver.requests) == 1
    [listed] = await dlq_json(env, "list")
    assert listed["attempts"] == 1
    assert listed["last_error"] == f"PermanentError: {receiver.url} answered 400"


async def test_a_duplicated_retry_message_has_one_effect(service_env, settings, fleet, tmp_path):
    """What a crash between publishing the retry and acking the original
    leaves behind: the failed attempt runs again on redelivery and publishes
    a second retry message. Both copies come back; one effect."""
    receiver = Receiver(500)
    env = {**service_env, "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "sources.toml", receiver.url)}
    source = load_sources(env["WEBHOOK_INGEST_SOURCES"])["acme"]
    event = make_event("acme", "evt_twice")
    await publish_twice_as_a_crash_would(settings, source, event)

    receiver.status = 200
    async with receiver.running():
        fleet.worker("--concurrency", "4", env=env)
        fleet.worker("--concurrency", "4", env=env)
        await wait_until(lambda: count_rows(settings.database_url, "processed_events"), 60, message="completion")
        await asyncio.sleep(2.5)  # both copies are back and handled (a copy deferred while in flight: 1 s)

    assert len(receiver.requests) == 1
    assert await count_rows(settings.database_url, "processed_events", "attempts = 2") == 1
    assert await count_rows(settings.database_url, "dead_letters") == 0


async def publish_twice_as_a_crash_would(settings, source, event) -> None:
    connection = await aio_pika.connect(settings.amqp_url)
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=1)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        await topology.declare_events_queue(channel, settings.namespace, settings.delivery_limit)
        await topology.declare_retry_queue(channel, settings.namespace, RETRY_DELAYS[0])
        failures = FailurePolicy(channel, pool, settings.namespace)
        for _ in range(2):  # the attempt, then its rerun after the crash
            await failures.fail(event, source, RuntimeError("receiver answered 500"))
    finally:
        await pool.close()
        await connection.close()


async def test_a_message_that_kills_its_worker_becomes_a_dead_letter_and_the_others_complete(
    service_env, settings, fleet, tmp_path
):
    limit = 2
    sources = tmp_path / "sources.toml"
    write_sources(sources, "", handler="tests.support.handlers:kills_its_process")
    env = {
        **service_env,
        "WEBHOOK_INGEST_SOURCES": str(sources),
        "WEBHOOK_INGEST_DELIVERY_LIMIT": str(limit),
        "WEBHOOK_INGEST_LOCK_TTL": "1",
    }
    poison = make_event("acme", "evt_poison", {"poison": True})
    others = [make_event("acme", f"evt_{n}") for n in range(5)]
    await publish_events(settings.amqp_url, settings.namespace, [poison, *others], delivery_limit=limit)

    workers = [fleet.worker("--concurrency", "1", env=env) for _ in range(2)]
    restarts = 0

    async def all_settled():
        nonlocal restarts
        for index, worker in enumerate(workers):
            if worker.popen.poll() is not None:
                workers[index] = fleet.worker("--concurrency", "1", env=env)
                restarts += 1
        return await count_rows(settings.database_url, "dead_letters") == 1 and await count_rows(
            settings.database_url, "inbox"
        ) == len(others)

    await wait_until(all_settled, 90, interval=0.3, message="the poison event dead, the others done")

    assert restarts >= limit  # it was delivered more than `limit` times, each one fatal
    [dead] = await dlq_json(env, "list")
    assert dead["key"] == poison.key
    assert dead["last_error"].startswith("DeliveryLimitExceeded: delivery limit exceeded")
    assert await count_rows(settings.database_url, "processed_events", f"key = '{poison.key}'") == 0
