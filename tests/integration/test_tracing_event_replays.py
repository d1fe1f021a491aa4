"""A replay by selection (issue 22, item 5) is traced as a dead letter's
replay is (docs/design.md, "Traces"): each replayed event a new trace, its
`replay` root the parent of its publish, under which the worker's steps run.
The in-process ingress, worker and exporter of test_tracing.py."""

import aio_pika
import asyncpg
from opentelemetry.trace import SpanKind

from tests.integration.shared.observability import test_tracing as traced
from tests.integration.shared.observability.test_tracing import (
    by_name,
    children_of,
    post,
    running_worker,
    until_committed,
)
from tests.support.ingress import running_ingress
from tests.support.processes import wait_until
from webhook_ingest.shared.archive.search import parse_filter
from webhook_ingest.shared.audit.actor import Actor
from webhook_ingest.shared.replays.store import EventReplayJob, EventReplayStore
from webhook_ingest.shared.runs import paced as paced_runs

sources, exported = traced.sources, traced.exported  # its fixtures


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
