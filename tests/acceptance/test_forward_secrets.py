"""`forward`'s credentials never reach a log, a viewer or a notification
(issue 36, finding 8), with the real ingress and worker processes: a URL's
user, password and query are redacted in every error text, and a secret
header goes in `handler_options.headers` as `env:` or `file:`."""

import base64
import contextlib
import json

import aiohttp
import orjson
import pytest
from aiohttp import web

from tests.support.processes import count_rows, wait_for_output, wait_until
from tests.support.tcpproxy import free_port
from webhook_ingest.shared import signatures

pytestmark = pytest.mark.slow

SOURCE_SECRET = "forward-secrets-source"
VIEWER = "viewer-token-for-the-forward-secrets-test"
NOTIFY_SECRET = "whsec_" + base64.b64encode(b"forward-secrets-notifications").decode()
PASSWORD, ACCESS_TOKEN, HEADER_TOKEN = "hunter2-password", "tok_live_0123456789", "bearer-from-the-environment"


class Receiver:
    """Answers `status` to every POST on /hook and records (headers, body)."""

    def __init__(self, status: int):
        self.status = status
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.port = free_port()

    async def _hook(self, request: web.Request) -> web.Response:
        self.received.append((dict(request.headers), await request.read()))
        return web.Response(status=self.status)

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


def deployment(tmp_path, service_env, options: str, **env: str) -> dict[str, str]:
    sources = tmp_path / "sources.toml"
    sources.write_text(
        f'[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["{SOURCE_SECRET}"]\n'
        f'handler = "forward"\nmax_attempts = 1\nhandler_options = {{ {options} }}\n'
    )
    return {
        **service_env,
        "WEBHOOK_INGEST_SOURCES": str(sources),
        "WEBHOOK_INGEST_VIEWER_TOKEN": VIEWER,
        "WEBHOOK_INGEST_ADMIN_TOKEN": "admin-token-for-the-forward-secrets-test",
        **env,
    }


async def deliver(ingress_url: str, event_id: str) -> None:
    body = orjson.dumps({"id": event_id})
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{ingress_url}/webhooks/acme", data=body, headers=signatures.sign("hmac-sha256", body, SOURCE_SECRET)
        ) as answer:
            assert answer.status == 200, await answer.text()


async def viewed(ingress_url: str, path: str) -> str:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{ingress_url}{path}", headers={"Authorization": f"Bearer {VIEWER}"}) as answer:
            assert answer.status == 200, await answer.text()
            return await answer.text()


async def test_a_forward_urls_credentials_reach_no_viewer_log_or_notification(service_env, settings, fleet, tmp_path):
    downstream, notified = Receiver(404), Receiver(200)  # 404: dead-lettered at once
    url = f"http://user:{PASSWORD}@127.0.0.1:{downstream.port}/hook?access_token={ACCESS_TOKEN}"
    env = deployment(
        tmp_path,
        service_env,
        f'url = "{url}"',
        WEBHOOK_INGEST_NOTIFY_WEBHOOK_URL=f"http://127.0.0.1:{notified.port}/hook",
        WEBHOOK_INGEST_NOTIFY_WEBHOOK_SECRET=NOTIFY_SECRET,
    )
    async with downstream.running(), notified.running():
        _ingress, ingress_url = fleet.ingress(env=env)
        worker = fleet.worker(env=env)
        await wait_until(_ready(ingress_url), 30, message="the ingress ready")
        await deliver(ingress_url, "evt_leak")
        await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 60, message="a dead letter")
        await wait_for_output(worker, "event_dead_lettered")
        await wait_until(_received(notified), 60, message="the incident notification")
        seen = {
            path: await wait_until(_showing(ingress_url, path, "/hook"), 30, message=path)
            for path in ("/admin/events?source=acme", "/admin/dead-letters", "/admin/incidents")
        }
    assert len(downstream.received) == 1  # it did reach the receiver, credentials and all
    seen["worker log"] = worker.output()
    seen["notification"] = notified.received[0][1].decode()
    for where, text in seen.items():
        assert f"127.0.0.1:{downstream.port}/hook" in text, where  # the host and path are said
        assert PASSWORD not in text and ACCESS_TOKEN not in text, where


async def test_forward_sends_headers_whose_values_are_secrets_from_the_environment_or_a_file(
    service_env, settings, fleet, tmp_path
):
    downstream = Receiver(200)
    key_file = tmp_path / "api-key"
    key_file.write_text("key-from-a-file\n")
    options = (
        f'url = "http://127.0.0.1:{downstream.port}/hook", headers = {{ Authorization = "env:FORWARD_TOKEN",'
        f' X-Api-Key = "file:{key_file}", X-Plain = "not a secret" }}'
    )
    env = deployment(tmp_path, service_env, options, FORWARD_TOKEN=f"Bearer {HEADER_TOKEN}")
    async with downstream.running():
        _, ingress_url = fleet.ingress(env=env)
        fleet.worker(env=env)
        await wait_until(_ready(ingress_url), 30, message="the ingress ready")
        await deliver(ingress_url, "evt_headers")
        await wait_until(_received(downstream), 60, message="the forwarded event")
    [(headers, _)] = downstream.received
    assert (headers["Authorization"], headers["X-Api-Key"], headers["X-Plain"]) == (
        f"Bearer {HEADER_TOKEN}",
        "key-from-a-file",
        "not a secret",
    )
    assert headers["Idempotency-Key"] == "acme:evt_headers"


def _ready(ingress_url: str):
    async def ready() -> bool:
        with contextlib.suppress(aiohttp.ClientError):
            async with aiohttp.ClientSession() as session, session.get(f"{ingress_url}/readyz") as answer:
                return answer.status == 200
        return False

    return ready


def _received(receiver: Receiver):
    async def received() -> bool:
        return bool(receiver.received)

    return received


def _showing(ingress_url: str, path: str, text: str):
    async def showing() -> str | None:
        page = await viewed(ingress_url, path)
        return page if text in json.dumps(json.loads(page)) else None

    return showing
