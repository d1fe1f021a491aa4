"""Pause and resume through the admin API and the console (issue 23, item 4),
on the real ingress app: the operator may, the viewer may not, unknown
sources are 404, every change is audited."""

import asyncpg

from tests.support.console import csrf_of, signed_in
from tests.support.ingress import running_ingress
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources

OPERATOR = "operator-token-for-the-session-tests-0123456789"
VIEWER = "viewer-token-for-the-pause-tests-0123456789"


async def test_the_admin_api_and_the_console_pause_and_resume_a_source(settings, monkeypatch):
    monkeypatch.setenv("WEBHOOK_INGEST_ADMIN_TOKEN", OPERATOR)
    monkeypatch.setenv("WEBHOOK_INGEST_VIEWER_TOKEN", VIEWER)
    sources = load_sources(None)
    [name] = list(sources)  # the built-in demo source
    operator, viewer = ({"Authorization": f"Bearer {token}"} for token in (OPERATOR, VIEWER))
    async with running_ingress(Settings(), sources) as client:
        assert (await client.post(f"/admin/sources/{name}/pause", headers=viewer)).status == 403
        assert (await client.post(f"/admin/sources/{name}/pause", headers=operator)).status == 200
        assert (await client.post(f"/admin/sources/{name}/pause", headers=operator)).status == 409
        assert (await client.post("/admin/sources/nope/pause", headers=operator)).status == 404
        [state] = await (await client.get("/admin/sources", headers=viewer)).json()
        assert (state["name"], state["paused"], state["paused_by"]) == (name, True, "operator (admin-api)")

        csrf = await signed_in(client, OPERATOR)
        page = await (await client.get("/console/sources")).text()
        assert "<strong>paused</strong> by operator (admin-api)" in page and ">Resume</button>" in page
        resumed = await client.post(f"/console/sources/{name}/resume", data={"csrf_token": csrf})
        assert resumed.status == 200
        assert f"Source {name} resumed" in await resumed.text() and ">Pause</button>" in await resumed.text()
        assert (await client.post("/console/sources/nope/pause", data={"csrf_token": csrf_of(page)})).status == 404
    connection = await asyncpg.connect(settings.database_url)
    try:
        audit = [(row["action"], row["via"]) for row in await connection.fetch("SELECT * FROM audit_log ORDER BY id")]
    finally:
        await connection.close()
    assert audit == [("pause_source", "admin-api"), ("resume_source", "console")]
