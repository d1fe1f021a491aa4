"""OpenTelemetry traces (issue 25, item 3), in-process: the real ingress
app and a real `Worker`, spans kept by the SDK's InMemorySpanExporter.

One trace per event, from the ingress's request to the worker's commit,
whatever the event went through: a retry, the outbox while the broker was
cut, a replay (a trace of its own, linked to the one it replays).
"""

import asyncio
import contextlib
import json

import aio_pika
import asyncpg
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from tests.support.broker import amqp_port
from tests.support.ingress import running_ingress
from tests.support.logs import captured_logs as our_logs
from tests.support.processes import wait_until
from tests.support.tcpproxy import TcpProxy
from webhook_ingest.shared import signatures
from webhook_ingest.shared.archive.search import parse_filter
from webhook_ingest.shared.audit.actor import Actor
from webhook_ingest.shared.dead_letters.store import DeadLetterStore
from webhook_ingest.shared.observability import tracing
from webhook_ingest.shared.replays.store import EventReplayJob, EventReplayStore
from webhook_ingest.shared.runs import paced as paced_runs
from webhook_ingest.shared.sources.model import load_sources
from webhook_ingest.workers.handlers import PermanentError
from webhook_ingest.workers.worker import Worker

SECRET = "trace-secret"
REQUEST = "POST /webhooks/{source}"
FAILURES: dict[str, list[type[Exception]]] = {}  # key: what its next runs raise, in turn


async def logged(event, ctx) -> None:
    """Logs a line, queries ctx.db, then raises what FAILURES has next for its key."""
    ctx.logger.info("handler_ran", key=event.key)
    await ctx.db.execute("SELECT 1")
    if FAILURES.get(event.key):
        raise FAILURES[event.key].pop(0)(f"failing on purpose, attempt {event.attempt}")


async def batched(event, ctx) -> None:
    await logged(event, ctx)


batched.batchable = True  # type: ignore[attr-defined]


@pytest.fixture
def sources(tmp_path):
    path = tmp_path / "sources.toml"
    path.write_text(
        "".join(
            f'[sources.{name}]\nscheme = "hmac-sha256"\nsecrets = ["{SECRET}"]\n'
            f'handler = "tests.integration.shared.observability.test_tracing:{name}"\n'
            "max_attempts = 3\nretry_delays = [0.2]\n"
            for name in ("logged", "batched")
        )
    )
    return load_sources(str(path))


@pytest.fixture
def exported():
    """Tracing on in this process, every span kept in memory; off again after."""
    exporter = InMemorySpanExporter()
    tracing.start("ingress", exporter)
    FAILURES.clear()
    try:
        yield exporter
    finally:
        tracing.stop()


@contextlib.asynccontextmanager
async def running_worker(settings, sources):
    worker = Worker(settings, sources, concurrency=8, grace_seconds=5)
    running = asyncio.create_task(worker.run())

    async def consuming() -> bool:
        if running.done():
            running.result()  # its error, rather than a time-out
        return worker.ready

    await wait_until(consuming, 30, message="the worker consuming")
    try:
        yield worker
    finally:
        worker.stop()
        await running


async def post(client, source: str, event_id: str) -> int:
    body = json.dumps({"id": event_id, "type": "test.event"}).encode()
    response = await client.post(f"/webhooks/{source}", data=body, headers=signatures.sign("hmac-sha256", body, SECRET))
    return response.status


async def until_committed(exported: InMemorySpanExporter, key: str) -> list[ReadableSpan]:
    """The spans, once the event's completion (its commit's span) ended."""

    async def committed() -> bool:
        return any(span.name == "commit" and _key(span) == key for span in exported.get_finished_spans())

    await wait_until(committed, 30, message=f"{key} committed")
    return list(exported.get_finished_spans())


def captured_logs():
    """Our modules' lines, each with its trace ids."""
    return our_logs(processors=[tracing.add_trace_ids])


@pytest.mark.parametrize("source", ["logged", "batched"], ids=["alone", "in-a-batch"])
async def test_one_trace_from_the_request_through_the_publish_to_the_handler_and_its_commit(
    settings, sources, exported, source
):
    with captured_logs() as logs:
        async with running_ingress(settings, sources) as client, running_worker(settings, sources):
            assert await post(client, source, "evt_1") == 200
            spans = await until_committed(exported, f"{source}:evt_1")

    [request] = [span for span in spans if span.name == REQUEST]
    trace_id = request.context.trace_id
    assert request.parent is None and request.kind is SpanKind.SERVER
    assert request.attributes["webhook.key"] == f"{source}:evt_1"
    [publish] = children_of(request, spans, kind=SpanKind.PRODUCER)
    worker_spans = children_of(publish, spans, kind=SpanKind.INTERNAL)  # beside them: the done marker's SET
    assert sorted(span.name for span in worker_spans) == ["claim", "commit", "handler", "lease"]
    assert all(span.context.trace_id == trace_id for span in worker_spans)
    handler = by_name(worker_spans, "handler")
    assert "SELECT" in [span.name for span in children_of(handler, spans)]  # its ctx.db query (and its turn's)
    assert by_name(worker_spans, "commit").start_time > handler.end_time
    [line] = [entry for entry in logs if entry["event"] == "handler_ran"]
    assert line["trace_id"] == format(trace_id, "032x")
    assert line["span_id"] == format(handler.context.span_id, "016x")
    [processed] = [entry for entry in logs if entry["event"] == "event_processed"]
    assert processed["trace_id"] == format(trace_id, "032x")


async def test_a_retry_stays_in_the_trace_of_its_event(settings, sources, exported):
    FAILURES["logged:evt_retry"] = [RuntimeError]
    async with running_ingress(settings, sources) as client, running_worker(settings, sources):
        assert await post(client, "logged", "evt_retry") == 200
        spans = await until_committed(exported, "logged:evt_retry")

    [request] = [span for span in spans if span.name == REQUEST]
    first, second = sorted((span for span in spans if span.name == "handler"), key=lambda span: span.start_time)
    assert first.context.trace_id == second.context.trace_id == request.context.trace_id
    assert (first.attributes["webhook.attempt"], second.attributes["webhook.attempt"]) == (1, 2)
    assert first.status.status_code is StatusCode.ERROR and first.events[0].name == "exception"
    retry_publish = parent_of(second, spans)  # the second attempt's message: published by the first's worker
    assert retry_publish.kind is SpanKind.PRODUCER and "retry" in retry_publish.name
    assert retry_publish.parent.span_id == parent_of(first, spans).context.span_id


async def test_an_event_accepted_into_the_outbox_keeps_its_trace_through_the_relay(
    settings, sources, exported, monkeypatch
):
    with TcpProxy("127.0.0.1", amqp_port()) as proxy:
        monkeypatch.setenv("AMQP_URL", proxy.url_for(settings.amqp_url))
        async with running_ingress(type(settings)(), sources) as client, running_worker(settings, sources):
            proxy.cut()
            assert await post(client, "logged", "evt_outbox") == 200
            assert await outbox_rows(settings.database_url) == 1
            proxy.restore()
            spans = await until_committed(exported, "logged:evt_outbox")

    [request] = [span for span in spans if span.name == REQUEST]
    [stored] = children_of(request, spans, name="outbox store")
    [relayed] = children_of(stored, spans, kind=SpanKind.PRODUCER)  # the relay's publish, from the row
    handler = by_name(children_of(relayed, spans), "handler")
    assert handler.context.trace_id == request.context.trace_id
    assert relayed.start_time > stored.end_time


async def test_a_replay_starts_a_trace_of_its_own_linked_to_the_one_that_failed(settings, sources, exported):
    FAILURES["logged:evt_dead"] = [PermanentError]  # a dead letter at once
    async with running_ingress(settings, sources) as client, running_worker(settings, sources):
        assert await post(client, "logged", "evt_dead") == 200
        dead_letter_id = await until_dead_lettered(settings.database_url)
        failed = next(span for span in exported.get_finished_spans() if span.name == "handler")
        await replay(settings, dead_letter_id)
        spans = await until_committed(exported, "logged:evt_dead")

    [replayed] = [span for span in spans if span.name == "replay"]
    assert replayed.parent is None and replayed.context.trace_id != failed.context.trace_id
    [link] = replayed.links
    assert link.context.trace_id == failed.context.trace_id
    assert link.context.span_id == failed.parent.span_id  # the failed attempt's message
    [publish] = children_of(replayed, spans, kind=SpanKind.PRODUCER)
    assert by_name(children_of(publish, spans), "handler").context.trace_id == replayed.context.trace_id


def by_name(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    [span] = [span for span in spans if span.name == name]
    return span


def children_of(
    parent: ReadableSpan, spans: list[ReadableSpan], name: str | None = None, kind: SpanKind | None = None
) -> list[ReadableSpan]:
    return [
        span
        for span in spans
        if span.parent is not None
        and span.parent.span_id == parent.context.span_id
        and (name is None or span.name == name)
        and (kind is None or span.kind is kind)
    ]


def parent_of(child: ReadableSpan, spans: list[ReadableSpan]) -> ReadableSpan:
    assert child.parent is not None
    [parent] = [span for span in spans if span.context.span_id == child.parent.span_id]
    return parent


def _key(span: ReadableSpan):
    return (span.attributes or {}).get("webhook.key")


async def outbox_rows(database_url: str) -> int:
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetchval("SELECT count(*) FROM outbox")
    finally:
        await connection.close()


async def until_dead_lettered(database_url: str) -> int:
    async def dead_letter_id():
        connection = await asyncpg.connect(database_url)
        try:
            return await connection.fetchval("SELECT id FROM dead_letters WHERE status = 'dead'")
        finally:
            await connection.close()

    return await wait_until(dead_letter_id, 30, message="a dead letter")


async def replay(settings, dead_letter_id: int) -> None:
    """As `webhook-ingest dlq replay ID` does, in this (traced) process."""
    connection = await aio_pika.connect(settings.amqp_url)
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=2)
    try:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        replayed = await DeadLetterStore(pool).replay(channel, settings.namespace, [dead_letter_id], actor=Actor.cli())
        assert replayed.replayed == [dead_letter_id]
    finally:
        await pool.close()
        await connection.close()


# A replay by selection (issue 22, item 5) is traced as a dead letter's
# replay is (docs/design.md, "Traces"): each replayed event a new trace, its
# `replay` root the parent of its publish, under which the worker's steps run.
# The in-process ingress, worker and exporter of the tests above.


async def test_each_replayed_event_starts_a_trace_of_its_own(settings, sources, exported):
    async with running_ingress(settings, sources) as client, running_worker(settings, sources):
        assert await post(client, "logged", "evt_1") == 200
        first = await until_committed(exported, "logged:evt_1")
        replay_id = await _replay(settings, "logged:evt_1")
        spans = await until_committed(exported, f"replay-{replay_id}/logged:evt_1")

    [replayed] = [span for span in spans if span.name == "replay"]
    assert replayed.parent is None
    assert replayed.context.trace_id not in {span.context.trace_id for span in first}
    assert dict(replayed.attributes) == {
        "webhook.events_replay_id": replay_id,
        "webhook.source": "logged",
        "webhook.key": f"replay-{replay_id}/logged:evt_1",
    }
    [publish] = children_of(replayed, spans, kind=SpanKind.PRODUCER)
    assert by_name(children_of(publish, spans), "handler").context.trace_id == replayed.context.trace_id


async def _replay(settings, key: str) -> int:
    connection = await asyncpg.connect(settings.database_url)
    try:

        async def archived() -> bool:
            return (
                await connection.fetchval("SELECT count(*) FROM event_archive WHERE key = $1 AND body IS NOT NULL", key)
                > 0
            )

        await wait_until(archived, 10, message=f"{key} archived")
        store = EventReplayStore(connection)
        prepared = await store.prepare(parse_filter({"key": key}), Actor.cli())
        claimed = await store.claim(prepared.id, 100)
        assert claimed is not None
        broker = await aio_pika.connect(settings.amqp_url)
        async with broker:
            channel = await broker.channel(publisher_confirms=True)
            assert (
                await paced_runs.run(EventReplayJob(claimed, Actor.cli(), store, lambda: channel, settings.namespace))
                == "done"
            )
        return prepared.id
    finally:
        await connection.close()
