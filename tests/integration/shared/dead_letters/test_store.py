"""The dead-letter store and on-call's tools on it (docs/reference.md §2, §8): the store
itself, `webhook-ingest dlq …` and `prune`, the admin HTTP API, the poison
drainer. Real Postgres and RabbitMQ; the CLI through click's CliRunner.
"""

import asyncio
import dataclasses
import json
import os
import sys
from datetime import datetime, timedelta

import aio_pika
import asyncpg
import pytest
from click.testing import CliRunner

from tests.support.broker import amqp_port
from tests.support.dead_letters import seed_dead_letters
from tests.support.events import make_event, publish_events, queue_depth
from tests.support.ingress import queued_events, running_ingress
from tests.support.processes import count_rows, wait_until
from tests.support.tcpproxy import TcpProxy
from webhook_ingest.cli.main import main
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.dead_letters.model import record_dead_letter
from webhook_ingest.shared.dead_letters.store import DeadLetterStore
from webhook_ingest.shared.event.message import to_amqp
from webhook_ingest.shared.observability import metrics
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources.model import load_sources, parse_source
from webhook_ingest.workers.claim.completions import CompletionStore
from webhook_ingest.workers.claim.retry import FailurePolicy, describe_failure
from webhook_ingest.workers.claim.states import Outcome
from webhook_ingest.workers.handlers import PermanentError
from webhook_ingest.workers.poison import drain_poison_queue, stop_draining

TOKEN = "s3cret-admin-token-of-the-dead-letter-tests"


def failure(attempt: int, text: str = "receiver answered 500") -> dict:
    try:
        raise RuntimeError(f"{text} (attempt {attempt})")
    except RuntimeError as exc:
        return describe_failure(exc, attempt)


async def seed(database_url: str, *events, attempts: int = 2) -> list[int]:
    """One dead letter per event, each with `attempts` failed attempts."""
    connection = await asyncpg.connect(database_url)
    try:
        return [
            await record_dead_letter(
                connection, dataclasses.replace(event, attempt=attempts), [failure(n) for n in range(1, attempts + 1)]
            )
            for event in events
        ]
    finally:
        await connection.close()


def dlq(*args: str):
    return CliRunner().invoke(main, ["dlq", *args])


# -- the store -----------------------------------------------------------------


async def test_a_dead_letter_keeps_the_event_as_received_and_every_error(settings):
    event = make_event("acme", "evt_1")
    binary = dataclasses.replace(make_event("acme", "evt_2"), body=b"\xff not json")
    first, second = await seed(settings.database_url, event, binary, attempts=3)

    connection = await asyncpg.connect(settings.database_url)
    try:
        store = DeadLetterStore(connection)
        row, raw, listed = await store.get(first), await store.get(second), await store.newest_first()
    finally:
        await connection.close()
    assert bytes(row["body"]) == event.body and row["payload"] == json.loads(event.body)
    assert row["headers"] == event.headers and row["status"] == "dead"
    assert [error["attempt"] for error in row["errors"]] == [1, 2, 3]
    assert all(
        error["type"] == "RuntimeError" and error["at"] and "Traceback" in error["traceback"] for error in row["errors"]
    )
    assert raw["payload"] is None and bytes(raw["body"]) == b"\xff not json"
    assert [item["id"] for item in listed] == [second, first]  # newest first


async def test_an_event_has_at_most_one_open_dead_letter(settings):
    event = make_event("acme", "evt_1")
    [first] = await seed(settings.database_url, event)
    assert await seed(settings.database_url, event) == [first]  # the redelivery after a crash
    other_payload = dataclasses.replace(event, payload_sha256="0" * 64)
    [second] = await seed(settings.database_url, other_payload)
    assert second != first
    connection = await asyncpg.connect(settings.database_url)
    try:
        await connection.execute("UPDATE dead_letters SET status = 'replayed' WHERE id = $1", first)
    finally:
        await connection.close()
    [third] = await seed(settings.database_url, event)  # replayed, failed again: a new one
    assert third not in (first, second)


# -- recording a failure -----------------------------------------------------------
# The worker acks the original once FailurePolicy.fail returns, so it must
# return only when the retry message is confirmed or the dead letter committed.


async def test_a_retry_is_confirmed_by_the_broker_before_fail_returns(settings):
    source = parse_source(
        "acme", {"scheme": "github", "secrets": ["s"], "handler": "inbox", "retry_delays": [30], "max_attempts": 3}
    )
    event = make_event("acme", "evt_1")
    pool = await asyncpg.create_pool(settings.database_url, min_size=0, max_size=1)
    try:
        with TcpProxy("127.0.0.1", amqp_port()) as proxy:
            connection = await aio_pika.connect_robust(proxy.url_for(settings.amqp_url))  # as the worker's
            channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
            retry_queue = await topology.declare_retry_queue(channel, settings.namespace, 30)
            failures = FailurePolicy(channel, pool, settings.namespace)
            assert await failures.fail(event, source, RuntimeError("boom")) is Outcome.RETRIED
            assert await queue_depth(settings.amqp_url, retry_queue.name) == 1  # there when fail returned
            proxy.cut()
            waiting = asyncio.create_task(failures.fail(event, source, RuntimeError("boom")))
            await asyncio.sleep(3)  # not RETRIED while the broker is away, so no ack (and no second run)
            assert not waiting.done()
            assert await queue_depth(settings.amqp_url, retry_queue.name) == 1
            proxy.restore()
            assert await asyncio.wait_for(waiting, 30) is Outcome.RETRIED  # once the broker confirmed it
            await connection.close()
        assert await queue_depth(settings.amqp_url, retry_queue.name) == 2
    finally:
        await pool.close()


async def test_a_dead_letter_is_committed_before_fail_returns(settings):
    source = parse_source("acme", {"scheme": "github", "secrets": ["s"], "handler": "inbox", "max_attempts": 1})
    event = make_event("acme", "evt_1")
    with TcpProxy("127.0.0.1", 5432) as proxy:
        pool = await asyncpg.create_pool(proxy.url_for(settings.database_url), min_size=0, max_size=1)
        try:
            failures = FailurePolicy(None, pool, settings.namespace)  # a dead letter needs no channel
            assert await failures.fail(event, source, RuntimeError("boom")) is Outcome.DEAD
            assert await count_rows(settings.database_url, "dead_letters") == 1  # committed, seen from outside
            proxy.cut()
            waiting = asyncio.create_task(failures.fail(make_event("acme", "evt_2"), source, RuntimeError("boom")))
            await asyncio.sleep(3)  # not DEAD while Postgres is away, so no ack (and no second run)
            assert not waiting.done()
            assert await count_rows(settings.database_url, "dead_letters") == 1
            proxy.restore()
            assert await asyncio.wait_for(waiting, 30) is Outcome.DEAD  # once committed
        finally:
            pool.terminate()
    assert await count_rows(settings.database_url, "dead_letters") == 2


# -- the CLI -------------------------------------------------------------------


def test_dlq_list_and_show_as_table_and_json(settings):
    one, two = asyncio.run(seed(settings.database_url, make_event("acme", "evt_1"), make_event("other", "evt_2")))

    table = dlq("list")
    assert table.exit_code == 0, table.stderr
    header, *lines = table.stdout.splitlines()
    assert header.split() == ["ID", "STATUS", "SOURCE", "KEY", "ATTEMPTS", "AGE", "LAST", "ERROR"]
    assert [line.split()[:5] for line in lines] == [
        [str(two), "dead", "other", "other:evt_2", "2"],
        [str(one), "dead", "acme", "acme:evt_1", "2"],
    ]
    assert "RuntimeError: receiver answered 500 (attempt 2)" in lines[0]

    [listed] = json.loads(dlq("list", "--source", "acme", "--json").stdout)
    assert listed["id"] == one and isinstance(listed["id"], int)
    assert {key: listed[key] for key in ("key", "source", "event_id", "status", "attempts", "last_error")} == {
        "key": "acme:evt_1",
        "source": "acme",
        "event_id": "evt_1",
        "status": "dead",
        "attempts": 2,
        "last_error": "RuntimeError: receiver answered 500 (attempt 2)",
    }
    assert datetime.fromisoformat(listed["created_at"]).utcoffset() == timedelta(0)
    assert datetime.fromisoformat(listed["updated_at"]).utcoffset() == timedelta(0)

    shown = json.loads(dlq("show", str(one), "--json").stdout)
    assert shown["payload"] == {"id": "evt_1", "type": "test.event"}
    assert shown["headers"] == {"content-type": "application/json"}
    assert [(e["attempt"], e["type"], e["message"]) for e in shown["errors"]] == [
        (1, "RuntimeError", "receiver answered 500 (attempt 1)"),
        (2, "RuntimeError", "receiver answered 500 (attempt 2)"),
    ]
    assert all(datetime.fromisoformat(e["at"]).utcoffset() == timedelta(0) for e in shown["errors"])
    readable = dlq("show", str(one))
    assert readable.exit_code == 0 and "attempt 2 at" in readable.stdout and '"evt_1"' in readable.stdout


def test_unknown_or_invalid_ids_are_one_line_errors(settings):
    [known] = asyncio.run(seed(settings.database_url, make_event("acme", "evt_1")))
    for args in (
        ["show", "999"],
        ["discard", str(known), "999"],
        ["replay", "999"],
        ["show", "x1"],
        ["replay"],
        ["replay", str(known), "--all"],
        ["show", "-1"],
        ["discard", "-5"],
    ):
        result = dlq(*args)
        assert result.exit_code != 0, args
        assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: "), args
    assert dlq("show", "999").stderr.strip() == "error: no dead letter with id 999"
    assert json.loads(dlq("list", "--json").stdout)[0]["status"] == "dead"  # the failed discard changed nothing


def test_discard_keeps_it_for_audit(settings):
    one, two = asyncio.run(seed(settings.database_url, make_event("acme", "evt_1"), make_event("acme", "evt_2")))
    result = dlq("discard", str(one))
    assert result.exit_code == 0 and result.stdout.strip() == f"discarded 1: {one}"
    assert [row["id"] for row in json.loads(dlq("list", "--json").stdout)] == [two]
    [discarded] = json.loads(dlq("list", "--status", "discarded", "--json").stdout)
    assert discarded["id"] == one and discarded["updated_at"] >= discarded["created_at"]
    assert len(json.loads(dlq("list", "--status", "all", "--json").stdout)) == 2


def test_replay_publishes_the_event_as_received_with_a_fresh_attempt_budget(settings):
    first, second, third = asyncio.run(
        seed(
            settings.database_url,
            make_event("acme", "evt_1"),
            make_event("acme", "evt_2"),
            make_event("other", "evt_3"),
            attempts=3,
        )
    )

    result = dlq("replay", str(first))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == f"replayed 1: {first}"
    [queued] = asyncio.run(queued_events(settings.amqp_url, settings.namespace))
    assert (queued.key, queued.attempt, queued.errors, queued.deliveries) == ("acme:evt_1", 1, (), 0)
    assert queued.body == make_event("acme", "evt_1").body and queued.headers == {"content-type": "application/json"}

    result = dlq("replay", "--all", "--source", "acme")
    assert result.exit_code == 0 and result.stdout.strip() == f"replayed 1: {second}"
    assert [e.key for e in asyncio.run(queued_events(settings.amqp_url, settings.namespace))] == ["acme:evt_2"]
    statuses = {row["id"]: row["status"] for row in json.loads(dlq("list", "--status", "all", "--json").stdout)}
    assert statuses == {first: "replayed", second: "replayed", third: "dead"}


def test_replay_uses_the_deployments_queue_whatever_this_shells_delivery_limit(settings):
    asyncio.run(publish_events(settings.amqp_url, settings.namespace, [], delivery_limit=3))  # the deployment's
    [dead] = asyncio.run(seed(settings.database_url, make_event("acme", "evt_1")))
    result = dlq("replay", str(dead))  # this shell: the default limit, 20
    assert result.exit_code == 0, result.stderr
    assert [e.key for e in asyncio.run(queued_events(settings.amqp_url, settings.namespace))] == ["acme:evt_1"]


async def _lock_waiters(database_url: str, count: int) -> bool:
    """At least `count` sessions of this database wait for a lock (asked
    outside any transaction: pg_stat_activity is a snapshot within one)."""
    return (
        await count_rows(database_url, "pg_stat_activity", "datname = current_database() AND wait_event_type = 'Lock'")
        >= count
    )


async def test_two_replays_at_once_publish_each_dead_letter_once(settings, service_env):
    """Two `dlq replay --all` at once (two operators, or the CLI beside the
    console's bulk replay): each dead letter is published by exactly one of
    them; the other skips it and says so, and each one's audit entry names
    what it replayed. The test holds the rows until both have read them."""
    ids = await seed_dead_letters(settings.database_url, "acme", 6)
    holder = await asyncpg.connect(settings.database_url)
    try:
        async with holder.transaction():
            await holder.execute("SELECT FROM dead_letters FOR UPDATE")
            replays = [
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "webhook_ingest",
                    "dlq",
                    "replay",
                    "--all",
                    env={**os.environ, **service_env},
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                )
                for _ in range(2)
            ]
            await wait_until(
                lambda: _lock_waiters(settings.database_url, 2), timeout=15, message="both replays waiting on a row"
            )
        outputs = [await asyncio.wait_for(replay.communicate(), 30) for replay in replays]
        audit = await DeadLetterStore(holder).audit_log.entries()
    finally:
        await holder.close()
    assert [replay.returncode for replay in replays] == [0, 0], outputs
    queued = await queued_events(settings.amqp_url, settings.namespace)
    assert sorted(event.key for event in queued) == sorted(f"acme:evt_{n}" for n in range(6))
    replayed = [_listed_ids(stdout.decode(), "replayed") for stdout, _ in outputs]
    skipped = [_listed_ids(stdout.decode(), "skipped") for stdout, _ in outputs]
    assert sorted(replayed[0] + replayed[1]) == ids, outputs
    assert sorted(replayed[0] + skipped[0]) == ids and sorted(replayed[1] + skipped[1]) == ids, outputs
    assert sorted(sorted(entry["dead_letter_ids"]) for entry in audit) == sorted(one for one in replayed if one)


def _listed_ids(output: str, what: str) -> list[int]:
    """The ids of the line `what N: 1, 2` (none when there is no such line, or N is 0)."""
    for line in output.splitlines():
        if line.startswith(f"{what} "):
            _, _, listed = line.partition(": ")
            return sorted(int(text) for text in listed.split(", ") if text)
    return []


async def test_prune_deletes_completion_records_past_the_window_in_batches(settings):
    connection = await asyncpg.connect(settings.database_url)
    try:
        now = await connection.fetchval("SELECT now()")
        for n, age in enumerate([timedelta(days=40)] * 5 + [timedelta(days=1)] * 2):
            await connection.execute(
                "INSERT INTO processed_events (key, source, event_id, payload_sha256, fencing_token, attempts,"
                " completed_at) VALUES ($1, 'acme', $2, 'h', 1, 1, $3)",
                f"acme:evt_{n}",
                f"evt_{n}",
                now - age,
            )
        assert await CompletionStore(connection).prune(timedelta(days=30), batch_size=2) == 5
        assert await connection.fetchval("SELECT count(*) FROM processed_events") == 2
    finally:
        await connection.close()

    result = await asyncio.to_thread(CliRunner().invoke, main, ["prune", "--older-than", "12h"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.strip() == "pruned 2 completion records older than 12h"
    for bad in ("0d", "30", "thirty days", "-1d"):
        refused = await asyncio.to_thread(CliRunner().invoke, main, ["prune", "--older-than", bad])
        assert refused.exit_code != 0 and refused.stderr.startswith("error: invalid duration"), bad


# -- the admin HTTP API --------------------------------------------------------


@pytest.fixture
def admin_settings(settings, monkeypatch) -> Settings:
    monkeypatch.setenv("WEBHOOK_INGEST_ADMIN_TOKEN", TOKEN)
    return Settings()


async def test_admin_api_needs_the_bearer_token(admin_settings):
    await seed(admin_settings.database_url, make_event("acme", "evt_1"))
    async with running_ingress(admin_settings, load_sources(None)) as client:
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": TOKEN},
            {"Authorization": f"Basic {TOKEN}"},
        ):
            for method, path in (
                ("GET", "/admin/dead-letters"),
                ("GET", "/admin/dead-letters/1"),
                ("POST", "/admin/dead-letters/1/replay"),
                ("POST", "/admin/dead-letters/1/discard"),
            ):
                response = await client.request(method, path, headers=headers)
                assert response.status == 401, (headers, path)
                assert await response.json() == {"error": "unauthorized"}
    assert [row["status"] for row in await _rows(admin_settings)] == ["dead"]


async def test_admin_api_is_absent_without_a_token(settings):
    async with running_ingress(settings, load_sources(None)) as client:
        for method, path in (("GET", "/admin/dead-letters"), ("POST", "/admin/dead-letters/1/discard")):
            response = await client.request(method, path, headers={"Authorization": f"Bearer {TOKEN}"})
            assert response.status == 404


async def test_admin_api_answers_a_five_thousand_digit_id_or_limit_with_400_not_500(admin_settings):
    """Issue 21, item 7: int() refuses more than 4,300 digits."""
    auth, huge = {"Authorization": f"Bearer {TOKEN}"}, "9" * 5000
    async with running_ingress(admin_settings, load_sources(None)) as client:
        for method, path in (
            ("GET", f"/admin/dead-letters/{huge}"),
            ("POST", f"/admin/dead-letters/{huge}/discard"),
            ("GET", f"/admin/dead-letters?limit={huge}"),
        ):
            assert (await client.request(method, path, headers=auth)).status == 400, path


async def test_admin_api_lists_shows_replays_and_discards_like_the_cli(admin_settings):
    one, two = await seed(admin_settings.database_url, make_event("acme", "evt_1"), make_event("other", "evt_2"))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with running_ingress(admin_settings, load_sources(None)) as client:
        listed = await (await client.get("/admin/dead-letters", headers=auth)).json()
        cli_listed = json.loads((await asyncio.to_thread(dlq, "list", "--json")).stdout)
        assert listed == cli_listed and [row["id"] for row in listed] == [two, one]
        assert [
            row["id"] for row in await (await client.get("/admin/dead-letters?source=acme", headers=auth)).json()
        ] == [one]

        shown = await client.get(f"/admin/dead-letters/{one}", headers=auth)
        assert shown.status == 200
        assert await shown.json() == json.loads((await asyncio.to_thread(dlq, "show", str(one), "--json")).stdout)
        for path, status in ((f"/admin/dead-letters/{two + 100}", 404), ("/admin/dead-letters/x1", 400)):
            assert (await client.get(path, headers=auth)).status == status

        replayed = await client.post(f"/admin/dead-letters/{one}/replay", headers=auth)
        assert replayed.status == 200 and (await replayed.json())["status"] == "replayed"
        discarded = await client.post(f"/admin/dead-letters/{two}/discard", headers=auth)
        assert discarded.status == 200 and (await discarded.json())["status"] == "discarded"
        assert (await client.post(f"/admin/dead-letters/{two + 100}/replay", headers=auth)).status == 404
        assert await (await client.get("/admin/dead-letters", headers=auth)).json() == []
        every = await (await client.get("/admin/dead-letters?status=all", headers=auth)).json()
        assert {row["id"]: row["status"] for row in every} == {one: "replayed", two: "discarded"}
    [queued] = await queued_events(admin_settings.amqp_url, admin_settings.namespace)
    assert (queued.key, queued.attempt) == ("acme:evt_1", 1)


async def test_two_admin_replays_of_one_dead_letter_at_once_publish_it_once(admin_settings):
    """Two operators press replay on one dead letter at once: one request
    replays it; the other is 409 changed_meanwhile and publishes nothing."""
    [dead] = await seed(admin_settings.database_url, make_event("acme", "evt_1"))
    auth = {"Authorization": f"Bearer {TOKEN}"}
    holder = await asyncpg.connect(admin_settings.database_url)
    try:
        async with running_ingress(admin_settings, load_sources(None)) as client:
            async with holder.transaction():
                await holder.execute("SELECT FROM dead_letters FOR UPDATE")  # until both have read the row
                requests = [
                    asyncio.create_task(client.post(f"/admin/dead-letters/{dead}/replay", headers=auth))
                    for _ in range(2)
                ]
                await wait_until(
                    lambda: _lock_waiters(admin_settings.database_url, 2),
                    timeout=15,
                    message="both replays waiting on the row",
                )
            answers = sorted(
                [(response.status, await response.json()) for response in await asyncio.gather(*requests)],
                key=lambda answer: answer[0],
            )
    finally:
        await holder.close()
    assert [status for status, _ in answers] == [200, 409], answers
    assert answers[0][1]["status"] == "replayed" and answers[1][1] == {"error": "changed_meanwhile"}
    assert [event.key for event in await queued_events(admin_settings.amqp_url, admin_settings.namespace)] == [
        "acme:evt_1"
    ]


async def _rows(settings) -> list[dict]:
    connection = await asyncpg.connect(settings.database_url)
    try:
        return await DeadLetterStore(connection).newest_first(status="all")
    finally:
        await connection.close()


# -- the gauge and the poison drainer -------------------------------------------


async def test_the_open_dead_letters_gauge_follows_the_table(settings):
    one, _ = await seed(settings.database_url, make_event("acme", "evt_1"), make_event("acme", "evt_2"))
    pool = await asyncpg.create_pool(settings.database_url, min_size=0, max_size=1)
    gauge = asyncio.create_task(DeadLetterStore(pool).keep_open_gauge(every=0.05))
    try:
        await wait_until(_gauge_is(2), 5, message="gauge 2")
        assert (await asyncio.to_thread(dlq, "discard", str(one))).exit_code == 0
        await wait_until(_gauge_is(1), 5, message="gauge 1")
    finally:
        gauge.cancel()
        await asyncio.gather(gauge, return_exceptions=True)
        await pool.close()


def _gauge_is(expected: int):
    async def check() -> bool:
        return metrics.dead_letters_open._value.get() == expected

    return check


async def test_the_poison_drainer_records_what_reaches_the_dead_queue(settings):
    poison = make_event("acme", "evt_poison")
    completed = make_event("acme", "evt_done")
    pool = await asyncpg.create_pool(settings.database_url, min_size=1, max_size=2)
    await pool.execute(
        "INSERT INTO processed_events (key, source, event_id, payload_sha256, fencing_token, attempts)"
        " VALUES ($1, 'acme', 'evt_done', $2, 1, 1)",
        completed.key,
        completed.payload_sha256,
    )
    connection = await aio_pika.connect(settings.amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        dead_queue = topology.dead_queue(settings.namespace)
        await topology.declare_dead_queue(channel, settings.namespace)
        for message in (to_amqp(poison), to_amqp(completed), aio_pika.Message(b"\x00 not ours", message_id="m-1")):
            await topology.publish(channel, message, dead_queue)
        consumer = await drain_poison_queue(await connection.channel(), pool, settings.namespace, delivery_limit=3)
        await wait_until(_rows_are(settings, 2), 10, message="two dead letters")
        await wait_until(_queue_empty(channel, dead_queue), 10, message="the dead queue drained")
        await asyncio.sleep(0.3)  # the last ack on its way
        await stop_draining(consumer)
    finally:
        await connection.close()
        rows = {row["key"]: row for row in await DeadLetterStore(pool).newest_first()}
        await pool.close()
    assert await queue_depth(settings.amqp_url, dead_queue) == 0  # every one acked, none returned
    assert set(rows) == {poison.key, "unknown:m-1"}  # the completed one was a lost ack, not poison
    assert rows[poison.key]["last_error"]["type"] == "DeliveryLimitExceeded"
    assert "delivery limit exceeded" in rows[poison.key]["last_error"]["message"]
    assert "more than 3 times" in rows[poison.key]["last_error"]["message"]
    assert rows["unknown:m-1"]["last_error"]["type"] == "UnreadableMessage"

    refused = await asyncio.to_thread(dlq, "replay", str(rows["unknown:m-1"]["id"]))
    assert refused.exit_code != 0 and "is not an event message" in refused.stderr
    replayed = await asyncio.to_thread(dlq, "replay", "--all")  # leaves the unreadable one dead
    assert replayed.exit_code == 0 and replayed.stdout.strip() == f"replayed 1: {rows[poison.key]['id']}"


def _rows_are(settings, expected: int):
    async def check() -> bool:
        return await count_rows(settings.database_url, "dead_letters") == expected

    return check


def _queue_empty(channel, queue_name: str):
    async def check() -> bool:
        queue = await channel.declare_queue(queue_name, passive=True)
        return queue.declaration_result.message_count == 0

    return check


# A dead letter can always be recorded, whatever the event holds (issue 10,
# item 4): a body jsonb refuses keeps its raw bytes with no parsed copy, and
# header values with undecodable bytes are stored, not raised on. Also the
# worker's side (workers/claim/retry FailurePolicy.dead_letter): the failure
# counted in its incident in the same transaction, never at the dead letter's
# expense.

UNSTORABLE_BODIES = [
    b'{"id":"e1","t":"\\ud83d"}',  # half an emoji
    b'{"id":"e1","n":1e400}',  # beyond float and jsonb
    b'{"id":"e1","t":"a\\u0000b"}',  # NUL, which jsonb refuses
    b'\xff\xfe{"id":"e1"}',  # not UTF-8
]


@pytest.mark.parametrize("body", UNSTORABLE_BODIES)
async def test_an_unstorable_body_is_still_recorded_with_its_raw_bytes(database, body):
    event = make_event("acme", "e1")
    event = type(event)(**{**event.__dict__, "body": body, "headers": {"x-odd": "caf\udce9", "x-ok": "yes"}})
    connection = await asyncpg.connect(database)
    try:
        dead_letter_id = await record_dead_letter(connection, event, [{"attempt": 1, "type": "E", "message": "m"}])
        row = await DeadLetterStore(connection).get(dead_letter_id)
        raw = await connection.fetchval("SELECT body FROM dead_letters WHERE id = $1", dead_letter_id)
    finally:
        await connection.close()
    assert raw == body  # what a replay publishes
    assert row["payload"] is None
    assert row["headers"]["x-ok"] == "yes" and row["headers"]["x-odd"].startswith("caf")


# -- the worker's dead letter also counts the failure in its incident (fee867c);
# what the count cannot write never keeps the dead letter from committing


@pytest.fixture
async def pool(database):
    pool = await asyncpg.create_pool(database, min_size=1, max_size=2)
    yield pool
    await pool.close()


async def _fetched(pool, query: str) -> list[dict]:
    async with pool.acquire() as connection:
        return [dict(row) for row in await connection.fetch(query)]


async def test_an_error_quoting_a_nul_and_a_lone_surrogate_is_dead_lettered_and_counted(pool):
    """R6-1, R6-2: the text Postgres refuses is written as U+FFFD, in the
    incident as in the dead letter (before: DataError, nothing committed)."""
    error = describe_failure(PermanentError("the CRM answered: name\x00 caf\udce9"), 1)
    dead_letter_id = await FailurePolicy(None, pool, "unused").dead_letter(
        make_event("acme", "evt_unstorable"), error, permanent=True, handler="forward"
    )
    assert dead_letter_id is not None
    [incident] = await _fetched(pool, "SELECT last_error, error_pattern, dead_letters FROM incidents")
    assert incident == {
        "last_error": "the CRM answered: name\ufffd caf\ufffd",
        "error_pattern": "the CRM answered: name\ufffd caf\ufffd",
        "dead_letters": 1,
    }


async def test_a_count_postgres_refuses_does_not_refuse_the_dead_letter(pool):
    """Whatever Postgres refuses in the count (here a trigger raising
    check_violation on incident_events: a constraint added later, a value
    out of range), the dead letter commits without it. Before, the refusal
    left `dead_letter`, the worker took it for its own crash and ran the
    handler again, up to the delivery limit."""
    async with pool.acquire() as connection:
        await connection.execute("""
            CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'refused' USING ERRCODE = 'check_violation'; END $$;
            CREATE TRIGGER refuse BEFORE INSERT ON incident_events FOR EACH ROW EXECUTE FUNCTION refuse();
        """)
    error = describe_failure(PermanentError("refused for good"), 1)
    dead_letter_id = await FailurePolicy(None, pool, "unused").dead_letter(
        make_event("acme", "evt_refused_count"), error, permanent=True, handler="forward"
    )
    assert dead_letter_id is not None
    assert await _fetched(pool, "SELECT id, status FROM dead_letters") == [{"id": dead_letter_id, "status": "dead"}]
    assert await _fetched(pool, "SELECT id FROM incidents") == []  # the count rolled back to its savepoint, alone


async def test_an_open_dead_letter_recorded_again_is_not_counted_again_in_its_incident(pool):
    """Copies of an event a worker does not know the source of wait apart
    (`unknown_source_waiting`), and each becomes a dead letter after 10
    minutes: the second finds the first open and records nothing — and
    the incident counted a second dead letter (finding R6-4), which
    "replay its open dead letters" then did not find. The same for an
    attempt run again (B4, B6) whose last attempt fails again. The second
    failure still counts as a failure."""
    policy = FailurePolicy(None, pool, "unused")
    event = make_event("acme", "evt_copied")
    error = {
        "attempt": 1,
        "at": "2026-11-25T00:00:00+00:00",
        "type": "UnknownSource",
        "message": "no worker knew source 'acme' for 600 s",
    }
    ids = {await policy.dead_letter(event, error), await policy.dead_letter(event, error)}
    assert len(ids) == 1
    assert await _fetched(pool, "SELECT failures, dead_letters FROM incidents") == [{"failures": 2, "dead_letters": 1}]
