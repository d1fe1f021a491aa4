"""Adversary, round 4, where one component suffices: the ingress app (the
real aiohttp app on the real broker and Postgres) at its edges. The
findings that need worker processes are in
tests/acceptance/test_retries_and_dead_letters.py and test_degraded.py."""

import json

from tests.support.ingress import queued_events, running_ingress
from webhook_ingest.shared import signatures
from webhook_ingest.shared.errors import ConfigError
from webhook_ingest.shared.sources.model import load_sources

SECRET = "round4-secret"


def _sources_file(tmp_path, *names: str) -> str:
    path = tmp_path / "sources.toml"
    path.write_text(
        "".join(
            f'[sources."{name}"]\nscheme = "hmac-sha256"\nsecrets = ["{SECRET}"]\nhandler = "inbox"\n' for name in names
        )
    )
    return str(path)


async def _post(client, source: str, body: bytes, **headers: str) -> tuple[int, dict]:
    response = await client.post(
        f"/webhooks/{source}", data=body, headers={**signatures.sign("hmac-sha256", body, SECRET), **headers}
    )
    return response.status, await response.json()


async def test_two_sources_never_share_an_idempotency_key(settings, tmp_path):
    """Finding C2. §5: the key is SOURCE:EVENT_ID, and keys never collide
    across sources. A source name may hold a colon (`[sources."acme:eu"]`,
    the URL /webhooks/acme:eu), so source `acme` with event id `eu:1` and
    source `acme:eu` with event id `1` are both the key `acme:eu:1`: the
    second event is taken for a copy (or a conflict) of the first and never
    runs. Either such a sources file is refused at start with a line naming
    the source, or the two events get two keys."""
    try:
        sources = load_sources(_sources_file(tmp_path, "acme", "acme:eu"))
    except ConfigError as refused:
        assert "acme:eu" in str(refused)
        return
    body = json.dumps({"type": "invoice.paid"}).encode()
    async with running_ingress(settings, sources) as client:
        first = await _post(client, "acme", body, **{"X-Event-ID": "eu:1"})
        second = await _post(client, "acme:eu", body, **{"X-Event-ID": "1"})
    assert first[0] == second[0] == 200
    assert len({event.key for event in await queued_events(settings.amqp_url, settings.namespace)}) == 2


async def test_a_long_header_name_reaches_the_handler_intact_or_is_refused(settings, tmp_path):
    """Finding C3. The provider's headers ride as an AMQP field table, whose
    field names pamqp cuts to 128 bytes with nothing but a log line: a
    header named longer than that reaches `event.headers` renamed, and two
    such headers that share their first 128 bytes become one — one value
    gone, answered 200. Bad input gets a clear error, or nothing is lost."""
    sources = load_sources(_sources_file(tmp_path, "acme"))
    prefix = "X-Trace-" + "t" * 130
    body = json.dumps({"id": "long-header-names"}).encode()
    async with running_ingress(settings, sources) as client:
        status, answer = await _post(client, "acme", body, **{prefix + "-a": "first", prefix + "-b": "second"})
    if status == 431:
        assert answer == {"error": "headers_too_large"}
        return
    assert status == 200
    [event] = await queued_events(settings.amqp_url, settings.namespace)
    assert {event.headers.get(prefix.lower() + "-a"), event.headers.get(prefix.lower() + "-b")} == {"first", "second"}


async def test_a_number_too_small_for_a_float_is_refused_or_told_apart(settings, tmp_path):
    """Finding C7. storable_json refuses 1e400 because "a handler would read
    inf, and 1e400 and 1e401 would hash alike". A nonzero number below the
    smallest float is the same case the other way: Python reads 1e-400 and
    2e-400 as 0.0, so the handler gets 0.0 for an amount that is not zero,
    and the two payloads hash alike — the corrected event (a conflict, §5)
    is taken for a copy of the first. Postgres's numeric keeps both exactly."""
    sources = load_sources(_sources_file(tmp_path, "acme"))
    bodies = [b'{"id":"tiny","amount":1e-400}', b'{"id":"tiny","amount":2e-400}']
    async with running_ingress(settings, sources) as client:
        answers = [await _post(client, "acme", body) for body in bodies]
    if all(answer == (400, {"error": "invalid_json"}) for answer in answers):
        return
    assert [status for status, _ in answers] == [200, 200]
    hashes = {event.payload_sha256 for event in await queued_events(settings.amqp_url, settings.namespace)}
    assert len(hashes) == 2


async def test_a_header_sent_twice_reaches_the_handler_with_both_values(settings, tmp_path):
    """Finding C8. HTTP allows a header name on several lines (a proxy
    adding its own `Via`, a provider's repeated `X-Tag`), and RFC 9110, section 5.3
    says they mean one line of the values joined by commas. The ingress
    kept the last line only: the earlier values never reached
    `event.headers`, answered 200 — "loses nothing" says otherwise."""
    from multidict import CIMultiDict

    sources = load_sources(_sources_file(tmp_path, "acme"))
    body = json.dumps({"id": "repeated-header"}).encode()
    headers = CIMultiDict(signatures.sign("hmac-sha256", body, SECRET))
    headers.add("X-Tag", "first")
    headers.add("X-Tag", "second")
    async with running_ingress(settings, sources) as client:
        response = await client.post("/webhooks/acme", data=body, headers=headers)
    assert response.status == 200
    [event] = await queued_events(settings.amqp_url, settings.namespace)
    assert event.headers["x-tag"] == "first, second"
