"""OpenTelemetry traces as an operator turns them on: a real `webhook-ingest
ingress` process whose only tracing setting is OTEL_EXPORTER_OTLP_ENDPOINT,
exporting to an OTLP/HTTP receiver (a tiny aiohttp server recording what is
posted to /v1/traces); and, without any OTEL_* variable, processes that
never load OpenTelemetry's tracing.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from aiohttp import ClientSession, web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from tests.support.processes import ROOT, wait_for_output, wait_until
from tests.support.tcpproxy import free_port
from webhook_ingest.shared import signatures

SECRET = "otlp-secret"


class Receiver:
    """Records every export request posted to /v1/traces."""

    def __init__(self) -> None:
        self.exports: list[ExportTraceServiceRequest] = []
        self.content_types: set[str] = set()

    async def traces(self, request: web.Request) -> web.Response:
        self.content_types.add(request.content_type)
        self.exports.append(ExportTraceServiceRequest.FromString(await request.read()))
        return web.Response(body=b"", content_type="application/x-protobuf")

    def spans(self) -> list[tuple[str, dict, object]]:
        """(service.name, the span's attributes, the span) of every span received."""
        received = []
        for export in self.exports:
            for resource_spans in export.resource_spans:
                service = _attributes(resource_spans.resource.attributes).get("service.name")
                for scope in resource_spans.scope_spans:
                    received += [(service, _attributes(span.attributes), span) for span in scope.spans]
        return received


def _attributes(key_values) -> dict:
    return {kv.key: kv.value.string_value or kv.value.int_value for kv in key_values}


@pytest.fixture
async def receiver():
    recorded = Receiver()
    app = web.Application()
    app.router.add_post("/v1/traces", recorded.traces)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    recorded.endpoint = f"http://127.0.0.1:{port}"  # type: ignore[attr-defined]
    yield recorded
    await runner.cleanup()


@pytest.fixture
def sources_file(tmp_path) -> str:
    path = tmp_path / "sources.toml"
    path.write_text(f'[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["{SECRET}"]\nhandler = "inbox"\n')
    return str(path)


async def test_an_ingress_given_an_otlp_endpoint_sends_its_spans_there(fleet, receiver, sources_file):
    ingress, base_url = fleet.ingress(
        env={
            "WEBHOOK_INGEST_SOURCES": sources_file,
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
    )
    await wait_for_output(ingress, "broker_connected")
    body = json.dumps({"id": "evt_otlp", "type": "test.event"}).encode()
    async with ClientSession() as session:
        async with session.post(
            f"{base_url}/webhooks/acme", data=body, headers=signatures.sign("hmac-sha256", body, SECRET)
        ) as response:
            assert response.status == 200
        async with session.get(f"{base_url}/healthz") as response:  # a probe: no trace of its own
            assert response.status == 200

    async def request_and_publish_received() -> bool:
        return len(receiver.spans()) >= 2

    await wait_until(request_and_publish_received, 30, message="spans at the receiver")
    assert "tracing_on" in ingress.output()
    assert receiver.content_types == {"application/x-protobuf"}
    by_name = {span.name: (service, attributes, span) for service, attributes, span in receiver.spans()}
    service, attributes, request = by_name["POST /webhooks/{source}"]
    assert service == "webhook-ingest-ingress"
    assert attributes["webhook.key"] == "acme:evt_otlp"
    [publish] = [span for _, _, span in receiver.spans() if span.parent_span_id == request.span_id]
    assert publish.trace_id == request.trace_id and publish.name.endswith(".events send")
    assert not any("healthz" in name for name in by_name)


def test_without_an_otel_variable_no_process_imports_opentelemetry_tracing(service_env, sources_file):
    """Off costs nothing: the ingress app built, a worker made, on-call's
    commands loaded — and nothing of OpenTelemetry's tracing in memory: not
    its SDK's tracing, no instrumentation, no exporter, not our
    tracing_otel. (redis-py 8 imports the metrics part of the SDK for
    itself when it is installed: its own per-command check is the same
    whether or not it is.)"""
    script = textwrap.dedent("""
        import sys
        from webhook_ingest.cli.main import main
        from webhook_ingest.cli import dlq, incidents
        from webhook_ingest.ingress.app import create_app
        from webhook_ingest.shared.observability import tracing
        from webhook_ingest.shared.settings import Settings
        from webhook_ingest.shared.sources.model import load_sources
        from webhook_ingest.workers.claim.batch import BatchProcessor
        from webhook_ingest.workers.worker import Worker

        settings = Settings()
        sources = load_sources(settings.sources_path)
        assert not tracing.start("ingress")
        create_app(settings, sources)
        Worker(settings, sources)
        tracing_modules = ("opentelemetry.sdk.trace", "opentelemetry.instrumentation", "opentelemetry.exporter",
                           "opentelemetry.propagate", "webhook_ingest.shared.observability.tracing_otel")
        loaded = sorted(name for name in sys.modules if name.startswith(tracing_modules))
        assert not loaded, loaded
        print("no opentelemetry")
    """)
    inherited = {name: value for name, value in os.environ.items() if not name.startswith("OTEL_")}
    env = inherited | service_env | {"WEBHOOK_INGEST_SOURCES": sources_file}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "no opentelemetry"
