"""Routes: one event, several handlers (docs/reference.md §3 `routes`,
docs/design.md "Routes"), with real worker processes.

Each (event, route) pair runs exactly once and independently: one route
failing until dead-lettered does not re-run the other; a replay of its dead
letter runs only it; copies of the event across two workers and a worker
killed while it fans out run each route once.

And at the edges of the route key KEY#ROUTE: a source whose name holds a
hash is refused; an event id ending in a route name is neither taken for
that route's run nor shown its dead letters, and is dead-lettered over the
delivery limit; a route's dead letter, discarded or listed, finds the
event's archived arrival; an event no route takes is archived `ignored`.
"""

import asyncio
import time
from dataclasses import replace
from datetime import timedelta

import asyncpg
import pytest
import redis.asyncio as redis

from tests.acceptance.test_retries import dlq_json, webhook_ingest
from tests.integration.shared.sources.test_ignore_rules import SECRET, stripe_event
from tests.support.dead_letters import failure
from tests.support.events import make_event, publish_events
from tests.support.ingress import running_ingress
from tests.support.processes import count_rows, wait_for_output, wait_until
from webhook_ingest.shared.archive import model as archive
from webhook_ingest.shared.archive.store import ArchiveStore
from webhook_ingest.shared.dead_letters.model import record_dead_letter
from webhook_ingest.shared.dead_letters.store import DeadLetterStore
from webhook_ingest.shared.errors import ConfigError
from webhook_ingest.shared.event.message import EventMessage
from webhook_ingest.shared.redis_keys import key_prefix
from webhook_ingest.shared.sources.model import load_sources
from webhook_ingest.shared.sources.routes import route_key

pytestmark = pytest.mark.slow


def write_sources(path, fail_file: str = "/nonexistent") -> str:
    path.write_text(
        "[sources.acme]\n"
        'scheme = "hmac-sha256"\n'
        'secrets = ["acme-secret"]\n'
        "max_attempts = 2\n"
        "retry_delays = [0.5]\n"
        "\n"
        "[[sources.acme.routes]]\n"
        'name = "billing"\n'
        'handler = "tests.support.handlers:counted_inbox"\n'  # batchable: batched runs too
        'types = ["invoice.*"]\n'
        "\n"
        "[[sources.acme.routes]]\n"
        'name = "audit"\n'
        'handler = "tests.support.route_handlers:fails_while_flagged"\n'
        f'handler_options = {{ fail_file = "{fail_file}" }}\n'
    )
    load_sources(str(path))  # fails at once while the file cannot be read
    return str(path)


async def effects(database_url: str) -> dict[str, int]:
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch("SELECT key, count(*) AS runs FROM effects GROUP BY key")
    finally:
        await connection.close()
    return {row["key"]: row["runs"] for row in rows}


def invoice(event_id: str):
    return make_event("acme", event_id, {"type": "invoice.paid"})


async def test_a_failing_route_is_dead_lettered_alone_and_its_replay_runs_only_it(
    service_env, settings, fleet, tmp_path, effects_tables
):
    fail_file = tmp_path / "fail"
    fail_file.write_text("fail")
    env = {**service_env, "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "sources.toml", str(fail_file))}
    event = invoice("evt_1")
    fleet.worker("--concurrency", "4", env=env)
    await publish_events(settings.amqp_url, settings.namespace, [event])
    await wait_until(lambda: count_rows(settings.database_url, "dead_letters"), 30, message="a dead letter")
    await wait_until(lambda: count_rows(settings.database_url, "processed_events"), 30, message="billing's run")

    [listed] = await dlq_json(env, "list")
    assert (listed["key"], listed["route"], listed["attempts"]) == ("acme:evt_1#audit", "audit", 2)
    shown = await dlq_json(env, "show", str(listed["id"]))
    assert shown["route"] == "audit" and shown["event_id"] == "evt_1"
    assert await effects(settings.database_url) == {"acme:evt_1#billing": 1}  # billing ran once, audit never

    fail_file.unlink()
    code, _stdout, stderr = await webhook_ingest(env, "dlq", "replay", str(listed["id"]))
    assert code == 0, stderr
    await wait_until(
        lambda: count_rows(settings.database_url, "processed_events", "key LIKE '%#audit'"),
        30,
        message="audit's completion",
    )
    await asyncio.sleep(1.0)  # room for a wrong second run of billing
    assert await effects(settings.database_url) == {"acme:evt_1#billing": 1, "acme:evt_1#audit": 1}
    assert sorted(await _completed_keys(settings.database_url)) == ["acme:evt_1#audit", "acme:evt_1#billing"]


async def test_an_event_no_route_takes_runs_nothing_and_a_type_filter_holds(
    service_env, settings, fleet, tmp_path, effects_tables
):
    env = {**service_env, "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "sources.toml")}
    fleet.worker(env=env)
    other = make_event("acme", "evt_other", {"type": "customer.created"})  # audit only
    await publish_events(settings.amqp_url, settings.namespace, [other, invoice("evt_inv")])
    await wait_until(_count_is(settings.database_url, 3), 30, message="three completions")
    assert await effects(settings.database_url) == {
        "acme:evt_other#audit": 1,
        "acme:evt_inv#billing": 1,
        "acme:evt_inv#audit": 1,
    }


async def test_copies_across_two_workers_run_each_route_once(service_env, settings, fleet, tmp_path, effects_tables):
    env = {**service_env, "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "sources.toml")}
    events = [invoice(f"evt_{n}") for n in range(40)]
    await publish_events(settings.amqp_url, settings.namespace, [*events, *events, *events])  # three copies each
    fleet.worker("--concurrency", "16", env=env)
    fleet.worker("--concurrency", "16", env=env)
    await wait_until(_count_is(settings.database_url, 80), 60, message="80 completions", interval=0.1)
    await asyncio.sleep(2.5)  # copies deferred while in flight come back after 1 s
    runs = await effects(settings.database_url)
    assert len(runs) == 80 and set(runs.values()) == {1}


async def test_what_a_fan_out_cut_short_leaves_runs_each_route_once(
    service_env, settings, fleet, tmp_path, effects_tables
):
    """A worker killed between publishing some of an event's route messages
    and acking the event: those route messages and the event, redelivered."""
    env = {**service_env, "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "sources.toml")}
    event = invoice("evt_cut")
    billing = replace(event, key=f"{event.key}#billing", route="billing")
    await publish_events(settings.amqp_url, settings.namespace, [billing, event])
    fleet.worker(env=env)
    await wait_until(_count_is(settings.database_url, 2), 30, message="two completions", interval=0.1)
    await asyncio.sleep(1.5)
    assert await effects(settings.database_url) == {"acme:evt_cut#billing": 1, "acme:evt_cut#audit": 1}


async def test_a_worker_killed_while_fanning_out_loses_nothing_and_runs_nothing_twice(
    service_env, settings, fleet, tmp_path, effects_tables
):
    env = {**service_env, "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "sources.toml")}
    events = [invoice(f"evt_{n}") for n in range(300)]
    await publish_events(settings.amqp_url, settings.namespace, events)
    victim = fleet.worker("--concurrency", "32", env=env)
    await wait_until(_count_is(settings.database_url, 20), 60, message="the first completions", interval=0.02)
    victim.kill()  # SIGKILL, mid-stream: fan-outs and runs cut wherever they were
    fleet.worker("--concurrency", "32", env=env)
    await wait_until(_count_is(settings.database_url, 600), 90, message="600 completions", interval=0.2)
    await asyncio.sleep(2.5)
    runs = await effects(settings.database_url)
    assert len(runs) == 600 and set(runs.values()) == {1}


async def test_a_route_message_a_worker_has_no_route_for_waits_and_holds_nothing_up(
    service_env, settings, fleet, tmp_path, effects_tables
):
    """Sources files out of step: a route renamed or removed while its
    messages were queued. Such a message waits for a worker that knows the
    route, as an unknown source's event does; the others run."""
    env = {**service_env, "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "sources.toml")}
    event = invoice("evt_gone")
    gone = replace(event, key=f"{event.key}#gone", route="gone")
    await publish_events(settings.amqp_url, settings.namespace, [gone, invoice("evt_next")])
    worker = fleet.worker(env=env)
    await wait_until(_count_is(settings.database_url, 2), 30, message="evt_next's two routes", interval=0.1)
    await wait_for_output(worker, '"route":"gone","event":"unknown_source_waiting"')
    assert await effects(settings.database_url) == {"acme:evt_next#billing": 1, "acme:evt_next#audit": 1}
    assert "processing_crashed" not in worker.output()


def _count_is(database_url: str, wanted: int):
    async def check():
        return await count_rows(database_url, "processed_events") >= wanted

    return check


async def _completed_keys(database_url: str) -> list[str]:
    connection = await asyncpg.connect(database_url)
    try:
        return [row["key"] for row in await connection.fetch("SELECT key FROM processed_events")]
    finally:
        await connection.close()


async def test_a_source_whose_name_holds_a_hash_is_refused(service_env, tmp_path):
    """R1: a source named 'acme#billing' and source acme's route 'billing'
    shared the handler key 'acme#billing' (and forward's bucket): the worker
    kept the later handler, so acme#billing's events ran acme's billing
    route handler instead of their own (seen against b51197a: its own,
    told to fail, never ran; effects {'acme#billing:evt_1': 1}). Such a
    name is now refused, as ':' and '/' are: one line, before anything runs."""
    sources = tmp_path / "sources.toml"
    sources.write_text(
        '[sources."acme#billing"]\n'
        'scheme = "hmac-sha256"\n'
        'secrets = ["s"]\n'
        'handler = "tests.support.route_handlers:counted_route"\n'
        "\n"
        "[sources.acme]\n"
        'scheme = "hmac-sha256"\n'
        'secrets = ["s"]\n'
        "\n"
        "[[sources.acme.routes]]\n"
        'name = "billing"\n'
        'handler = "tests.support.route_handlers:counted_route"\n'
    )
    with pytest.raises(ConfigError, match="source 'acme#billing': name: must be non-empty, without ':', '/' or '#'"):
        load_sources(str(sources))
    code, _, stderr = await webhook_ingest({**service_env, "WEBHOOK_INGEST_SOURCES": str(sources)}, "worker")
    assert code != 0 and "source 'acme#billing': name:" in stderr


async def test_discarding_a_routes_dead_letter_marks_the_events_archived_arrival_discarded(database):
    """R2: the discard's archive update looked for the dead letter's key,
    KEY#ROUTE, where the archive keeps the event under KEY (seen against
    b51197a: the arrival stayed 'dead')."""
    event = make_event("acme", "evt_d", {"type": "invoice.paid"})
    event = replace(event, received_at=round(event.received_at, 3))  # as the ingress stamps it: whole ms
    audit = replace(event, key=route_key(event.key, "audit"), route="audit")
    connection = await asyncpg.connect(database)
    try:
        store = ArchiveStore(connection)
        await store.keep({"acme": timedelta(days=7)})
        await store.write_arrivals([archive.arrival_row(event, "invoice.paid", "{}", archive.QUEUED)])
        # what workers/claim/archive_notes.py writes for the route's dead letter: the event's own row
        await store.write_outcomes([archive.outcome_row(event, archive.DEAD, event.received_at, "route audit: boom")])
        dead_letter_id = await record_dead_letter(connection, audit, [failure(1)])
        await DeadLetterStore(connection).discard([dead_letter_id])
        status = await connection.fetchval("SELECT status FROM event_archive WHERE key = $1", event.key)
    finally:
        await connection.close()
    assert status == "discarded"


async def test_a_routed_events_archived_page_lists_its_routes_dead_letters(database):
    """R3: the page's dead letters were those keyed KEY, and a route's is
    KEY#ROUTE (seen against 8450e20: none listed). Each route's completion,
    under its own key, is the page's `completions` (given the source's
    routes): tests/integration/shared/sources/test_routes.py."""
    event = make_event("acme", "evt_s", {"type": "invoice.paid"})
    event = replace(event, received_at=round(event.received_at, 3))
    audit = replace(event, key=route_key(event.key, "audit"), route="audit")
    connection = await asyncpg.connect(database)
    try:
        store = ArchiveStore(connection)
        await store.keep({"acme": timedelta(days=7)})
        await store.write_arrivals([archive.arrival_row(event, "invoice.paid", "{}", archive.QUEUED)])
        await store.write_outcomes([archive.outcome_row(event, archive.DEAD, event.received_at, "route audit: boom")])
        dead_letter_id = await record_dead_letter(connection, audit, [failure(1)])
        shown = await store.event(event.key)
    finally:
        await connection.close()
    assert shown is not None and shown["arrivals"][0]["status"] == "dead"
    assert [(letter["id"], letter.get("route")) for letter in shown["dead_letters"]] == [(dead_letter_id, "audit")]


async def test_an_event_the_workers_routes_no_longer_take_is_not_archived_queued_for_ever(
    service_env, settings, fleet, tmp_path
):
    """R4: acked with nothing run (event_unrouted), its arrival stayed
    'queued' for its whole retention (seen against 0e129f8); now `ignored`."""
    sources = tmp_path / "sources.toml"
    sources.write_text(  # the ingress's file had a route for every type; this worker's takes invoices only
        "[sources.acme]\n"
        'scheme = "hmac-sha256"\n'
        'secrets = ["s"]\n'
        "\n"
        "[[sources.acme.routes]]\n"
        'name = "billing"\n'
        'handler = "tests.support.route_handlers:counted_route"\n'
        'types = ["invoice.*"]\n'
    )
    event = make_event("acme", "evt_u", {"type": "customer.created"})
    event = replace(event, received_at=round(event.received_at, 3))
    connection = await asyncpg.connect(settings.database_url)
    try:
        store = ArchiveStore(connection)
        await store.keep({"acme": timedelta(days=7)})
        await store.write_arrivals([archive.arrival_row(event, "customer.created", "{}", archive.QUEUED)])
        worker = fleet.worker(env={**service_env, "WEBHOOK_INGEST_SOURCES": str(sources)})
        await publish_events(settings.amqp_url, settings.namespace, [event])
        await wait_for_output(worker, '"event":"event_unrouted"')

        async def archived_status() -> str:
            return await connection.fetchval("SELECT status FROM event_archive WHERE key = $1", event.key)

        async def settled() -> bool:
            return await archived_status() != archive.QUEUED

        await wait_until(settled, 10, message="the arrival no longer queued")
        assert await archived_status() == archive.IGNORED
    finally:
        await connection.close()


async def test_an_event_id_ending_in_a_route_name_is_not_taken_for_that_routes_run(
    service_env, settings, fleet, tmp_path, redis_cleanup
):
    """R5: the ingress looked the bare key up in the done markers, and
    evt_a's route billing completed under stripe:evt_a#billing, event
    evt_a#billing's key: with the same content hash it was answered
    duplicate and lost for every route (seen against becf80b)."""
    path = tmp_path / "sources.toml"
    path.write_text(
        f'[sources.stripe]\nscheme = "stripe"\nsecrets = ["{SECRET}"]\nhash_fields = ["data"]\n'
        '[[sources.stripe.routes]]\nname = "billing"\nhandler = "inbox"\ntypes = ["invoice.*"]\n'
    )
    fleet.worker(env={**service_env, "WEBHOOK_INGEST_SOURCES": str(path)})
    async with running_ingress(settings, load_sources(str(path))) as client:

        async def post(event_id: str) -> dict:
            body, headers = stripe_event(event_id, "invoice.paid")  # the same data: the same content hash
            response = await client.post("/webhooks/stripe", data=body, headers=headers)
            return await response.json()

        assert (await post("evt_a"))["status"] == "accepted"
        await wait_until(
            lambda: count_rows(settings.database_url, "processed_events", "key = 'stripe:evt_a#billing'"),
            30,
            message="evt_a's billing run",
        )
        markers = redis.from_url(settings.redis_urls[0])
        try:  # its Redis done marker, written beside the completion
            await wait_until(
                lambda: markers.exists(key_prefix(settings.namespace) + "stripe:evt_a#billing"),
                30,
                message="evt_a's billing done marker",
            )
        finally:
            await markers.aclose()
        assert await post("evt_a#billing") == {"status": "accepted", "key": "stripe:evt_a#billing"}


async def test_an_event_whose_id_ends_in_a_route_name_lists_only_its_own_dead_letters(database):
    """R3's query, first written, listed on event `evt_b#audit`'s page the
    dead letter of event `evt_b`'s route `audit` (key `acme:evt_b#audit`,
    the page's key): a route's dead letter belongs to KEY less '#ROUTE'."""
    event = make_event("acme", "evt_b", {"type": "invoice.paid"})
    event = replace(event, received_at=round(event.received_at, 3))
    audit = replace(event, key=route_key(event.key, "audit"), route="audit")
    other = replace(make_event("acme", "evt_b#audit"), received_at=event.received_at)
    connection = await asyncpg.connect(database)
    try:
        store = ArchiveStore(connection)
        await store.keep({"acme": timedelta(days=7)})
        await store.write_arrivals(
            [archive.arrival_row(one, "invoice.paid", "{}", archive.QUEUED) for one in (event, other)]
        )
        dead_letter_id = await record_dead_letter(connection, audit, [failure(1)])
        own, others = await store.event(event.key), await store.event(other.key)
    finally:
        await connection.close()
    assert own is not None and [letter["id"] for letter in own["dead_letters"]] == [dead_letter_id]
    assert others is not None and others["dead_letters"] == []


async def test_copies_of_the_event_fanned_out_while_a_route_is_retrying_run_nothing_twice(
    service_env, settings, fleet, tmp_path, effects_tables
):
    """The event's copies (a provider's resends) fanned out again by two
    workers while its route `audit` waits between attempts and `billing`
    has completed: billing's copies are duplicates, audit's attempt-1
    copies were handed on; audit completes once, nothing is dead-lettered."""
    fail_file = tmp_path / "fail"
    fail_file.write_text("fail")
    sources = tmp_path / "sources.toml"
    sources.write_text(
        "[sources.acme]\n"
        'scheme = "hmac-sha256"\n'
        'secrets = ["s"]\n'
        "max_attempts = 20\n"
        "retry_delays = [0.3]\n"
        "\n"
        "[[sources.acme.routes]]\n"
        'name = "billing"\n'
        'handler = "tests.support.route_handlers:counted_route"\n'
        "\n"
        "[[sources.acme.routes]]\n"
        'name = "audit"\n'
        'handler = "tests.support.route_handlers:fails_while_flagged"\n'
        f'handler_options = {{ fail_file = "{fail_file}" }}\n'
    )
    env = {**service_env, "WEBHOOK_INGEST_SOURCES": str(sources)}
    event = make_event("acme", "evt_r", {"type": "invoice.paid"})
    first = fleet.worker("--concurrency", "8", env=env)
    await publish_events(settings.amqp_url, settings.namespace, [event])
    await wait_for_output(first, '"event":"event_retry_scheduled"')
    second = fleet.worker("--concurrency", "8", env=env)
    await publish_events(settings.amqp_url, settings.namespace, [event] * 6)
    await wait_until(
        lambda: count_rows(settings.database_url, "processed_events", "key = 'acme:evt_r#billing'"),
        30,
        message="billing's run",
    )
    fail_file.unlink()
    await wait_until(
        lambda: count_rows(settings.database_url, "processed_events", "key = 'acme:evt_r#audit'"),
        30,
        message="audit's run",
    )

    async def all_fanned_out() -> bool:  # seven arrivals, each fanned out once or more
        return sum(worker.output().count('"outcome":"routed"') for worker in (first, second)) >= 7

    await wait_until(all_fanned_out, 30, message="seven fan-outs")
    await asyncio.sleep(1.5)  # room for a wrong second run (copies deferred while in flight come back after 1 s)
    connection = await asyncpg.connect(settings.database_url)
    try:
        runs = {
            row["key"]: row["runs"]
            for row in await connection.fetch("SELECT key, count(*) AS runs FROM effects GROUP BY key")
        }
    finally:
        await connection.close()
    assert runs == {"acme:evt_r#billing": 1, "acme:evt_r#audit": 1}
    assert await count_rows(settings.database_url, "dead_letters") == 0


async def test_a_routed_event_over_the_delivery_limit_whose_id_ends_in_a_route_name_is_dead_lettered(
    service_env, settings, fleet, tmp_path, redis_cleanup
):
    path = tmp_path / "sources.toml"
    path.write_text(
        f'[sources.stripe]\nscheme = "stripe"\nsecrets = ["{SECRET}"]\nhash_fields = ["data"]\n'
        '[[sources.stripe.routes]]\nname = "billing"\nhandler = "inbox"\ntypes = ["invoice.*"]\n'
    )
    worker = fleet.worker(env={**service_env, "WEBHOOK_INGEST_SOURCES": str(path)})
    async with running_ingress(settings, load_sources(str(path))) as client:
        body, headers = stripe_event("evt_a", "invoice.paid")
        assert (await (await client.post("/webhooks/stripe", data=body, headers=headers)).json())[
            "status"
        ] == "accepted"
        await wait_until(
            lambda: count_rows(settings.database_url, "processed_events", "key = 'stripe:evt_a#billing'"),
            30,
            message="evt_a's billing run",
        )
    connection = await asyncpg.connect(settings.database_url)
    try:  # the same data as evt_a's: the same content hash
        sha = await connection.fetchval(
            "SELECT payload_sha256 FROM processed_events WHERE key = 'stripe:evt_a#billing'"
        )
    finally:
        await connection.close()
    body, _ = stripe_event("evt_a#billing", "invoice.paid")
    poisoned = EventMessage(
        key="stripe:evt_a#billing",
        source="stripe",
        event_id="evt_a#billing",
        payload_sha256=sha,
        received_at=time.time(),
        body=body,
        headers={"content-type": "application/json"},
        deliveries=10_000,
    )  # as if it had crashed workers up to the limit
    await publish_events(settings.amqp_url, settings.namespace, [poisoned])
    await wait_for_output(worker, '"event":"poison_message_')  # recorded, or dropped as already completed
    assert "poison_message_already_completed" not in worker.output()
    assert await count_rows(settings.database_url, "dead_letters", "key = 'stripe:evt_a#billing'") == 1


async def test_a_routed_events_route_runs_after_a_plain_event_under_its_key_was_dead_lettered(
    service_env, settings, fleet, tmp_path, redis_cleanup
):
    """R6 beyond the completion check: the poison drainer recorded the
    attempt of event evt_b#billing it dead-lettered as handed on under its
    key, evt_b's route billing's, whose attempt 1 (same content hash) was
    then a copy and never ran. A routed source's own event hands no attempt
    on (it is only ever fanned out)."""
    path = tmp_path / "sources.toml"
    path.write_text(
        f'[sources.stripe]\nscheme = "stripe"\nsecrets = ["{SECRET}"]\nhash_fields = ["data"]\n'
        '[[sources.stripe.routes]]\nname = "billing"\nhandler = "inbox"\ntypes = ["invoice.*"]\n'
    )
    worker = fleet.worker(env={**service_env, "WEBHOOK_INGEST_SOURCES": str(path)})
    async with running_ingress(settings, load_sources(str(path))) as client:
        body, headers = stripe_event("evt_c", "invoice.paid")  # only to learn the content hash of this data
        assert (await (await client.post("/webhooks/stripe", data=body, headers=headers)).json())[
            "status"
        ] == "accepted"
        await wait_until(
            lambda: count_rows(settings.database_url, "processed_events", "key = 'stripe:evt_c#billing'"),
            30,
            message="evt_c's billing run",
        )
        connection = await asyncpg.connect(settings.database_url)
        try:
            sha = await connection.fetchval(
                "SELECT payload_sha256 FROM processed_events WHERE key = 'stripe:evt_c#billing'"
            )
        finally:
            await connection.close()
        body, _ = stripe_event("evt_b#billing", "invoice.paid")
        poisoned = EventMessage(
            key="stripe:evt_b#billing",
            source="stripe",
            event_id="evt_b#billing",
            payload_sha256=sha,
            received_at=time.time(),
            body=body,
            headers={"content-type": "application/json"},
            deliveries=10_000,
        )
        await publish_events(settings.amqp_url, settings.namespace, [poisoned])
        await wait_for_output(worker, '"event":"poison_message_recorded"')
        body, headers = stripe_event("evt_b", "invoice.paid")  # its route billing's key: stripe:evt_b#billing
        assert (await (await client.post("/webhooks/stripe", data=body, headers=headers)).json())[
            "status"
        ] == "accepted"

        async def billing_settled() -> bool:
            return (
                "attempt_already_handed_on" in worker.output()
                or await count_rows(settings.database_url, "processed_events", "key = 'stripe:evt_b#billing'") > 0
            )

        await wait_until(billing_settled, 30, message="evt_b's billing run, or its refusal")
    assert await count_rows(settings.database_url, "processed_events", "key = 'stripe:evt_b#billing'") == 1
