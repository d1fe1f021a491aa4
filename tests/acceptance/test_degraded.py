"""Degraded, not down (docs/reference.md §7.4), with real worker and ingress
processes: with Postgres or RabbitMQ unreachable or refusing, work waits and
resumes by itself, and no handler's attempt is spent on an outage.

Covers a failover as clients see it (a read-only server, sessions that keep
its read-only default, a session that ends unseen), the ingress answering 200
through a healthy broker while Postgres is away, refused Postgres sessions
(too many clients) and the connection budget under a pooler (transaction
pooling refused; a burst, a dropped renewal or completion session repeating
no call).

Ten workers within a stock Postgres's max_connections:
test_connection_budget.py; Redis outages: test_three_redis.py."""

import asyncio
import uuid

import asyncpg
import pytest

from tests.acceptance.test_outbox import event_bodies, merge, post_all, until_ready
from tests.conftest import _admin
from tests.support import pgbouncer
from tests.support.events import make_event, publish_events, queue_depth
from tests.support.exactly_once import assert_each_once, until_completed, write_sources
from tests.support.processes import count_rows, wait_for_output, wait_until
from tests.support.tcpproxy import TcpProxy
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.db.pooler import TransactionPooler, refuse_transaction_pooling

HANDLERS = "tests.support.handlers"


WARM_SERVERS = 3  # server sessions idle in the pooler, as in front of any deployment under traffic


async def _warm(url: str, servers: int) -> None:
    """Leaves `servers` server sessions idle in the pooler: as many clients' statements at once."""
    clients = [await asyncpg.connect(url, statement_cache_size=0) for _ in range(servers)]
    try:
        await asyncio.gather(*(client.execute("SELECT pg_sleep(0.3)") for client in clients))
    finally:
        for client in clients:
            await client.close()


BURST = 800
IN_FLIGHT = 10
RENEWAL_SESSION = (
    "SELECT pid FROM pg_stat_activity WHERE usename = $1 AND query LIKE '%lease_until = clock_timestamp()%'"
)
EVENTS = 30


# A Postgres that refuses a new session is an outage, never a handler's failure
# (issue 35, finding 6): "sorry, too many clients already" spent an attempt of
# every handler whose `ctx.db` asked for a connection the server would not
# give. The worker connects as a role of its own whose connection limit is
# set, once the worker is consuming, to the sessions it holds: every session
# it opens after that is refused with the server's own error (SQLSTATE 53300,
# as when max_connections is reached), while the ones it has go on working.
@pytest.fixture
async def limited_role(database, effects_tables):
    """A login role with every right on this test's database; yields its
    name and a database URL that connects as it."""
    role = f"wi_limited_{uuid.uuid4().hex[:12]}"
    connection = await asyncpg.connect(database)
    try:
        await connection.execute(f'CREATE ROLE "{role}" LOGIN')
        for grant in (
            "ALL ON ALL TABLES IN SCHEMA public",
            "ALL ON ALL SEQUENCES IN SCHEMA public",
            "ALL ON SCHEMA public",
        ):
            await connection.execute(f'GRANT {grant} TO "{role}"')
        yield role, database.replace("postgres@", f"{role}@", 1)
    finally:
        await connection.execute(f'ALTER ROLE "{role}" CONNECTION LIMIT -1')
        await connection.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", role)
        await connection.execute(f'DROP OWNED BY "{role}"')
        await connection.execute(f'DROP ROLE "{role}"')
        await connection.close()


@pytest.mark.usefixtures("effects_tables")
async def test_a_postgres_that_refuses_writes_for_a_while_dead_letters_nothing(settings, fleet, tmp_path):
    """A failover as clients see it: for a few seconds the server they are
    connected to is a read-only standby (the old primary, demoted), then
    its sessions end and new ones reach a writable primary. Work must wait
    and resume (§7.4): the event is processed, not dead-lettered."""
    database = settings.database_url.rsplit("/", 1)[1]
    sources = write_sources(tmp_path / "s.toml", "tests.support.handlers:slow_inbox")
    await _admin(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
    worker = fleet.worker(
        "--concurrency", "1", env={"WEBHOOK_INGEST_SOURCES": sources, "WEBHOOK_INGEST_DELIVERY_LIMIT": "2"}
    )
    await wait_for_output(worker, "worker_consuming")
    event = make_event("acme", "evt_read_only")
    await publish_events(settings.amqp_url, settings.namespace, [event], delivery_limit=2)
    await asyncio.sleep(5)  # read-only for 5 s
    await _admin(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')
    await _admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{database}'")

    async def settled() -> bool:
        return (
            await count_rows(settings.database_url, "processed_events")
            + await count_rows(settings.database_url, "dead_letters")
            > 0
        )

    await wait_until(settled, 60, message="the event processed or dead-lettered")
    assert await count_rows(settings.database_url, "dead_letters") == 0
    assert await count_rows(settings.database_url, "inbox") == 1


@pytest.mark.usefixtures("effects_tables")
async def test_sessions_opened_while_postgres_was_read_only_do_not_stay_read_only(settings, fleet, tmp_path):
    """Adversary note: after a failover, the sessions a worker opened against
    the read-only server keep its read-only default though Postgres is
    writable again — here the database's default is reset and no session
    is ended (a pooler or a proxy in front of Postgres keeps them). The
    worker must not wait on them for ever: the event is processed (§7.4)."""
    database = settings.database_url.rsplit("/", 1)[1]
    sources = write_sources(tmp_path / "s.toml", "tests.support.handlers:slow_inbox")
    await _admin(f'ALTER DATABASE "{database}" SET default_transaction_read_only = on')
    worker = fleet.worker("--concurrency", "1", env={"WEBHOOK_INGEST_SOURCES": sources})
    await wait_for_output(worker, "worker_consuming")
    await publish_events(settings.amqp_url, settings.namespace, [make_event("acme", "evt_read_only_sessions")])
    await asyncio.sleep(3)  # read-only for 3 s
    await _admin(f'ALTER DATABASE "{database}" RESET default_transaction_read_only')

    await until_completed(settings.database_url, 1, timeout=60)
    assert await count_rows(settings.database_url, "dead_letters") == 0
    assert await count_rows(settings.database_url, "inbox") == 1


@pytest.mark.usefixtures("effects_tables")
async def test_with_postgres_away_a_burst_on_a_healthy_broker_is_answered_200(settings, fleet, tmp_path):
    """Postgres is away for the ingress (a failover, a cut): the broker is the
    one path, and it is healthy, confirming within milliseconds. A provider
    sends bursts of 64 requests at once (its backlog after an outage of its
    own), never more than the ingress's bound of 64 in flight, so the bound
    itself answers no 503. Every request must get 200: the broker takes each
    event (§6: 503 only when neither the broker nor the outbox took it). Since
    434defa a request that finds half the bound (32) waiting for confirms
    makes the broker suspect, wakes the 32 waiting requests and sends them
    and every next request to the outbox — which is away: 503, though the
    broker confirms their publishes a moment later."""
    env = {
        "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", f"{HANDLERS}:counted_inbox"),
        "WEBHOOK_INGEST_MAX_CONCURRENT_REQUESTS": "64",
    }
    with TcpProxy("127.0.0.1", 5432) as postgres:
        postgres.cut()
        ingress, base_url = fleet.ingress(env={**env, "DATABASE_URL": postgres.url_for(settings.database_url)})
        await until_ready(base_url, via="broker")
        statuses: dict[int, int] = {}
        for burst in range(10):
            answered = await post_all(base_url, event_bodies(range(burst * 64, (burst + 1) * 64)), connections=64)
            statuses = merge(statuses, answered)
    queued = await queue_depth(settings.amqp_url, topology.events_queue(settings.namespace))
    assert statuses == {200: 640}, (
        statuses,
        f"{queued} messages on the events queue (no worker runs)",
        [line for line in ingress.output().splitlines() if '"unavailable"' in line][:3],
    )


@pytest.mark.usefixtures("effects_tables")
async def test_a_run_whose_postgres_session_ended_unseen_goes_on_with_a_new_one(settings, fleet, tmp_path):
    """Finding C6. A failover that drops the old primary's traffic (as RDS
    Multi-AZ does), or a partition that outlasts the server's keepalives:
    the statement a worker had just sent is never answered, and no FIN or
    RST ever arrives. §7.4: with Postgres unreachable, work waits and
    resumes by itself when it returns. A run's statements inside its
    handler's transaction are bounded by the lease timer (07141b4), but
    the one before it — taking the key's lease — and the worker's other
    own statements have no limit: the run waits for ever on the dead
    session, its message held, though Postgres answers new sessions."""
    from tests.support.tcpproxy import TcpProxy

    sources = write_sources(tmp_path / "s.toml", "tests.support.handlers:counted_inbox")
    event = make_event("acme", "evt_sent_into_the_failover")
    with TcpProxy("127.0.0.1", 5432) as postgres:
        worker = fleet.worker(
            "--concurrency",
            "2",
            env={"WEBHOOK_INGEST_SOURCES": sources, "DATABASE_URL": postgres.url_for(settings.database_url)},
        )
        await wait_for_output(worker, "worker_consuming")
        postgres.stall()  # the old primary drops everything
        await publish_events(settings.amqp_url, settings.namespace, [event])
        await asyncio.sleep(0.5)  # the run has sent its lease statement
        postgres.orphan()  # its session is gone, and nothing says so
        postgres.flow()  # the new primary answers new sessions
        await wait_until(
            lambda: count_rows(settings.database_url, "processed_events"),
            20,
            message="the event processed on a new session",
        )


async def test_a_refused_connection_spends_no_attempt(settings, fleet, tmp_path, database, limited_role):
    role, role_url = limited_role
    sources = write_sources(tmp_path / "s.toml", "tests.support.handlers:writes_then_waits")
    worker = fleet.worker(env={"WEBHOOK_INGEST_SOURCES": sources, "DATABASE_URL": role_url})
    await wait_for_output(worker, "worker_consuming")
    admin = await asyncpg.connect(database)
    try:
        held = await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE usename = $1", role)
        await admin.execute(f'ALTER ROLE "{role}" CONNECTION LIMIT {held}')

        events = [make_event("acme", f"evt_{n}") for n in range(EVENTS)]
        await publish_events(settings.amqp_url, settings.namespace, events)

        async def settled() -> bool:  # each event completed or dead-lettered
            completed = await count_rows(database, "processed_events")
            return completed + await count_rows(database, "dead_letters") >= EVENTS

        await wait_until(settled, 90, message=f"{EVENTS} events settled")

        attempts = await admin.fetch("SELECT key, attempts FROM processed_events ORDER BY key")
    finally:
        await admin.close()
    assert "too many connections" in worker.output()  # the refusals this test is about did happen
    await assert_each_once(settings.database_url, events)  # none dead-lettered
    assert {row["attempts"] for row in attempts} == {1}
    assert "event_retry_scheduled" not in worker.output()


async def test_transaction_pooling_with_round_robin_servers_is_refused(stock_postgres):
    with pgbouncer.running(stock_postgres, "transaction", more="server_round_robin = 1\n") as url:
        await _warm(url, WARM_SERVERS)
        with pytest.raises(TransactionPooler):
            await refuse_transaction_pooling(url)


async def test_transaction_pooling_with_idle_servers_is_refused(stock_postgres):
    """The same with PgBouncer's default (LIFO) server order: refused."""
    with pgbouncer.running(stock_postgres, "transaction") as url:
        await _warm(url, WARM_SERVERS)
        with pytest.raises(TransactionPooler):
            await refuse_transaction_pooling(url)


@pytest.mark.alone  # 512 runs in flight renewing on one connection each: 4 tests beside it starve the renewals
async def test_a_burst_of_slow_transactions_and_dead_letters_runs_each_call_once(
    settings, fleet, tmp_path, effects_tables, downstream
):
    """Two default workers (8 connections: 4 transactions, 2 statements, 1
    renewal), 256 in flight each, a backlog of handlers that hold their
    transaction across a 300 ms call, a quarter of them dead letters on the
    statement pool: each key is POSTed once, no lease is lost."""
    sources = write_sources(
        tmp_path / "s.toml", "tests.support.handlers:writes_calls_then_fails_some", url=downstream.url
    )
    events = [make_event("acme", f"evt_{n}") for n in range(BURST)]
    await publish_events(settings.amqp_url, settings.namespace, events)
    workers = [fleet.worker(env={"WEBHOOK_INGEST_SOURCES": sources}) for _ in range(2)]
    dead = [event for event in events if int(event.event_id.rsplit("_", 1)[1]) % 4 == 0]

    async def settled() -> bool:
        return (
            await count_rows(settings.database_url, "processed_events")
            + await count_rows(settings.database_url, "dead_letters")
        ) >= BURST

    await wait_until(settled, 600, interval=1, message=f"{BURST} events settled")
    logs = "".join(worker.output() for worker in workers)
    assert downstream.posts == {event.key: 1 for event in events}
    assert await count_rows(settings.database_url, "dead_letters") == len(dead)
    assert [
        word
        for word in ("processing_lock_lost", "lease_lost_handler_cancelled", "event_deferred", "event_retry_scheduled")
        if word in logs
    ] == []


async def test_a_dropped_renewal_session_on_a_full_server_repeats_no_call(
    settings, fleet, tmp_path, database, limited_role, downstream
):
    """Ten calls in flight (8 s each) under valid leases; the server is full
    for the worker's role (as at its max_connections: the shipped manifests
    at 10 worker pods, a rollout's surge) and the worker's one renewal
    session ends (a TCP reset, a renewal that timed out and was closed, an
    operator's pg_terminate_backend). Postgres answers throughout and no one
    else takes a key: a refused session is an outage, not a lost lease."""
    role, role_url = limited_role
    sources = write_sources(tmp_path / "s.toml", "forward", url=downstream.url + "?latency=8")
    worker = fleet.worker(env={"WEBHOOK_INGEST_SOURCES": sources, "DATABASE_URL": role_url})
    await wait_for_output(worker, "worker_consuming")
    events = [make_event("acme", f"evt_{n}") for n in range(IN_FLIGHT)]
    await publish_events(settings.amqp_url, settings.namespace, events)
    admin = await asyncpg.connect(database)
    try:

        async def all_calling() -> bool:
            return len(downstream.posts) == IN_FLIGHT and await admin.fetchval(RENEWAL_SESSION, role) is not None

        await wait_until(all_calling, 60, message="every call in flight, leases renewed")
        held = await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE usename = $1", role)
        await admin.execute(f'ALTER ROLE "{role}" CONNECTION LIMIT {held - 1}')  # full once the session ends
        await admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = ANY($1::int[])",
            [row["pid"] for row in await admin.fetch(RENEWAL_SESSION, role)],
        )
        await asyncio.sleep(4)  # the server stays full a few seconds, more than a lease's TTL
        await admin.execute(f'ALTER ROLE "{role}" CONNECTION LIMIT -1')

        async def settled() -> bool:
            return await count_rows(database, "processed_events") >= IN_FLIGHT

        await wait_until(settled, 120, message=f"{IN_FLIGHT} completions")
    finally:
        await admin.close()
    assert downstream.posts == {event.key: 1 for event in events}
    assert "lease_lost_handler_cancelled" not in worker.output()


async def test_a_refused_completion_session_repeats_no_call(
    settings, fleet, tmp_path, database, limited_role, downstream
):
    """Ten calls in flight (3 s each) under valid leases; the server is full
    for the worker's role and every session but the renewal one ends (as a
    pool's session idle past asyncpg's 300 s is closed and reopened on the
    next burst, or a TCP reset): the leases stay renewed, but each
    completion needs a new statement session, refused until the server has
    room again 3 s after the calls ended. No one else took a key."""
    role, role_url = limited_role
    sources = write_sources(tmp_path / "s.toml", "forward", url=downstream.url + "?latency=3")
    worker = fleet.worker(env={"WEBHOOK_INGEST_SOURCES": sources, "DATABASE_URL": role_url})
    await wait_for_output(worker, "worker_consuming")
    events = [make_event("acme", f"evt_{n}") for n in range(IN_FLIGHT)]
    await publish_events(settings.amqp_url, settings.namespace, events)
    admin = await asyncpg.connect(database)
    try:

        async def all_calling() -> bool:
            return len(downstream.posts) == IN_FLIGHT and await admin.fetchval(RENEWAL_SESSION, role) is not None

        await wait_until(all_calling, 60, message="every call in flight, leases renewed")
        renewal = await admin.fetchval(RENEWAL_SESSION, role)
        others = [
            row["pid"]
            for row in await admin.fetch(
                "SELECT pid FROM pg_stat_activity WHERE usename = $1 AND pid <> $2", role, renewal
            )
        ]
        await admin.execute(f'ALTER ROLE "{role}" CONNECTION LIMIT 1')  # the renewal session alone
        await admin.execute("SELECT pg_terminate_backend(pid) FROM unnest($1::int[]) AS pid", others)
        await asyncio.sleep(6)  # the calls end meanwhile; the server stays full 3 s longer
        await admin.execute(f'ALTER ROLE "{role}" CONNECTION LIMIT -1')

        async def settled() -> bool:
            return await count_rows(database, "processed_events") >= IN_FLIGHT

        await wait_until(settled, 120, message=f"{IN_FLIGHT} completions")
    finally:
        await admin.close()
    assert downstream.posts == {event.key: 1 for event in events}
