"""The contract floor (issue 39): the least a pipeline can do and still keep
our contract for the bench's handler, an insert of the event's row, written
plainly with the libraries we use, under the same load client, services
and layout as ours (`--phase contract_floor`; in `make bench` after the
main phases).

- An ingress process per core (as many as ours) on one port (aiohttp's
  `reuse_port`, SO_REUSEPORT; uvloop): reads the body, checks the
  `hmac-sha256` signature, parses the JSON once, takes the id and type,
  publishes the body persistent to a quorum queue with the provider's
  headers (as `event.headers` has them), awaits the publisher confirm and
  answers 200.
- A consumer process per worker of ours (prefetch as our concurrency):
  what has arrived is one batch; in one transaction it inserts the
  completion rows (`processed_events`, unique per key, `ON CONFLICT DO
  NOTHING`, the keys it inserted returned), the `inbox` rows of those keys
  and an archive row per message (`event_archive`, `processed`, or
  `duplicate` for a key completed before); commits, then acks the batch
  with one `multiple` ack.

Our migrated schema (a database of its own), so the rows, their indexes and
the archive's search indexes are ours. What it leaves out is what our
extra guarantees cost (docs/performance.md): no Redis (claim, done marker),
no lease nor fence, no turn, no outbox when the broker is away, no archived
arrival before its outcome, no retries, dead letters or metrics.

Each of those guarantees can be added to the floor alone (`measure`'s
`knobs`; `--phase guarantee_costs`, tests/bench/guarantee_costs.py), as
plainly: `claim` a Redis lock per key (SET NX PX, released by a
compare-and-delete script); `lease` our lease statement, the completed-keys
check after it and the completion fenced by the lease's token (our SQL,
workers/queries.sql); `turn` the advisory lock per key first in the
transaction; `done` the done marker (the ingress's GET of it per request,
the consumer's SET per key after the commit); `metrics` a counter and a
histogram per request and per event; `no_archive` the floor without its
archive rows.

`python -m tests.bench.contract_floor ingress AMQP_URL QUEUE PORT SECRET KNOBS NS`
and `… consume AMQP_URL QUEUE DATABASE_URL PREFETCH KNOBS NS` are its
processes (KNOBS: comma-separated, `-` for none; NS: its Redis keys'
prefix); each prints `ready`."""

import asyncio
import hashlib
import hmac
import os
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

import aio_pika
import asyncpg
import orjson
import redis.asyncio as redis

from tests.bench import httpload
from tests.bench.cpu import CpuMeter
from tests.bench.deployment import (
    AMQP_URL,
    CONCURRENCY,
    INGRESS_PROCESSES,
    REDIS_URL,
    SECRET,
    SERVER_URL,
    WORKERS,
    fetchval,
)
from tests.support.processes import wait_until
from tests.support.tcpproxy import free_port
from webhook_ingest.cli.migrate import migrate
from webhook_ingest.shared.db import load_queries

SOURCE, SOURCE_TABLE = "floor", "event_archive_contract_floor"
EVENTS, WARM_EVENTS = 20_000, 2_000
NOT_KEPT = frozenset({"authorization", "cookie", "connection", "keep-alive", "transfer-encoding", "upgrade"})
ACCEPTED = b'{"status":"accepted"}'

COMPLETE = """
INSERT INTO processed_events (key, source, event_id, payload_sha256, attempts, message_id, arrival)
SELECT key, $2, event_id, payload_sha256, 1, event_id, arrival
FROM unnest($1::text[], $3::text[], $4::text[], $5::int8[]) AS b(key, event_id, payload_sha256, arrival)
ON CONFLICT (key) DO NOTHING
RETURNING key
"""
INBOX = """
INSERT INTO inbox (key, source, event_id, payload, received_at)
SELECT key, $2, event_id, payload::jsonb, timestamptz 'epoch' + received_ms * interval '1 millisecond'
FROM unnest($1::text[], $3::text[], $4::text[], $5::int8[]) AS b(key, event_id, payload, received_ms)
ON CONFLICT (key) DO NOTHING
"""
ARCHIVE = """
INSERT INTO event_archive (source, key, received_at, arrival, event_id, event_type, payload_sha256, body, headers,
                           status, attempts, completed_at)
SELECT $2, key, timestamptz 'epoch' + received_ms * interval '1 millisecond', arrival, event_id, event_type,
       payload_sha256, body, headers::jsonb, status, 1, now()
FROM unnest($1::text[], $3::int8[], $4::int8[], $5::text[], $6::text[], $7::text[], $8::bytea[], $9::text[],
            $10::text[])
     AS b(key, received_ms, arrival, event_id, event_type, payload_sha256, body, headers, status)
ON CONFLICT DO NOTHING
"""
KNOBS = ("claim", "lease", "turn", "done", "metrics", "no_archive")
OURS = load_queries("webhook_ingest.workers")  # take_leases, completed_keys, take_turns, complete_events
LOCK_MS, DONE_SECONDS = 3_000, 7 * 86_400
RELEASE = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"


def metrics(knobs: frozenset[str]):
    """A counter and a histogram, as ours keep per request and per event (None without `metrics`)."""
    if "metrics" not in knobs:
        return None
    from prometheus_client import Counter, Histogram

    return Counter("floor_total", "", ["source", "status"]), Histogram("floor_seconds", "", ["source"])


# --- the ingress ---------------------------------------------------------------------------------------------------


async def serve(amqp_url: str, queue: str, port: int, secret: str, knobs: frozenset[str], namespace: str) -> None:
    from aiohttp import web

    connection = await aio_pika.connect(amqp_url)
    channel = await connection.channel(publisher_confirms=True)
    exchange, key = channel.default_exchange, secret.encode()
    arrivals = iter(range(os.getpid() << 32, (os.getpid() + 1) << 32))
    markers = redis.from_url(REDIS_URL) if "done" in knobs else None
    counted = metrics(knobs)

    async def receive(request: web.Request) -> web.Response:
        started = time.perf_counter()
        body = await request.read()
        expected = "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, request.headers.get("X-Signature", "")):
            return web.json_response({"error": "bad signature"}, status=401)
        event = orjson.loads(body)
        if markers is not None:  # a copy of a completed event is answered at the door
            marker = await markers.get(f"{namespace}:key:{request.match_info['source']}:{event['id']}")
            if marker == b"done:" + hashlib.sha256(body).hexdigest().encode():
                return web.json_response({"status": "duplicate"})
        headers = {name.lower(): value for name, value in request.headers.items() if name.lower() not in NOT_KEPT}
        message = aio_pika.Message(
            body,
            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            message_id=str(event["id"]),
            type=event.get("type"),
            headers={
                "source": request.match_info["source"],
                "received_ms": int(time.time() * 1000),
                "arrival": next(arrivals),
                "request": orjson.dumps(headers).decode(),
            },
        )
        try:
            await exchange.publish(message, routing_key=queue)  # returns once confirmed
        except aio_pika.exceptions.AMQPError:
            return web.json_response({"error": "unavailable"}, status=503)
        if counted is not None:
            counted[0].labels(request.match_info["source"], "accepted").inc()
            counted[1].labels(request.match_info["source"]).observe(time.perf_counter() - started)
        return web.Response(body=ACCEPTED, content_type="application/json")

    app = web.Application()
    app.router.add_post("/webhooks/{source}", receive)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, reuse_port=True).start()
    print("ready", flush=True)
    await asyncio.Event().wait()


# --- the consumer --------------------------------------------------------------------------------------------------


async def consume(
    amqp_url: str, queue_name: str, database_url: str, prefetch: int, knobs: frozenset[str], namespace: str
) -> None:
    database = await asyncpg.connect(database_url)
    guards = Guards(knobs, namespace)
    connection = await aio_pika.connect(amqp_url)
    channel = await connection.channel()
    await channel.set_qos(prefetch_count=prefetch)
    queue = await channel.get_queue(queue_name, ensure=False)
    arrived: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
    await queue.consume(arrived.put)  # type: ignore[arg-type]
    print("ready", flush=True)
    while True:
        batch = [await arrived.get()]
        while not arrived.empty():
            batch.append(arrived.get_nowait())
        started = time.perf_counter()
        keys = [f"{m.headers['source']}:{m.message_id}" for m in batch]
        await guards.before(database, keys)
        async with database.transaction():
            await guards.within(database, keys)
            await write(database, batch, keys, guards)
        await batch[-1].ack(multiple=True)  # one writer: every earlier delivery is committed too
        await guards.after(batch, keys, started)


class Guards:
    """What the knobs add around the floor's transaction (all nothing without them)."""

    def __init__(self, knobs: frozenset[str], namespace: str):
        self.knobs, self.namespace = knobs, namespace
        self.redis = redis.from_url(REDIS_URL) if knobs & {"claim", "done"} else None
        self.counted = metrics(knobs)
        self.tokens: dict[str, int] = {}
        self.lock_value = uuid.uuid4().hex

    async def before(self, database: asyncpg.Connection, keys: list[str]) -> None:
        distinct = sorted(set(keys))
        if "claim" in self.knobs:  # a key held elsewhere would wait; the floor's keys never are
            pipe = self.redis.pipeline(transaction=False)
            for key in distinct:
                pipe.set(f"{self.namespace}:key:{key}", self.lock_value, nx=True, px=LOCK_MS)
            await pipe.execute()
        # autocommit, before the transaction; then the check, in its own snapshot. The bench's keys are
        # unique, so every lease is granted: a key held elsewhere, which ours defers, is not handled here.
        if "lease" in self.knobs:
            rows = await database.fetch(OURS["take_leases"], distinct, LOCK_MS)
            self.tokens = {row["key"]: row["token"] for row in rows}
            await database.fetch(OURS["completed_keys"], distinct)

    async def within(self, database: asyncpg.Connection, keys: list[str]) -> None:
        if "turn" in self.knobs:
            await database.fetch(OURS["take_turns"], sorted(set(keys)))

    async def complete(self, database: asyncpg.Connection, keys, source, ids, hashes, arrivals) -> set[str]:
        if "lease" not in self.knobs:
            return {row[0] for row in await database.fetch(COMPLETE, keys, source, ids, hashes, arrivals)}
        first = {key: n for n, key in reversed(list(enumerate(keys)))}  # one row per key, its first message
        rows = list(first.values())
        nothing = [None] * len(rows)
        completed = await database.fetch(
            OURS["complete_events"],
            [keys[n] for n in rows],
            [source] * len(rows),
            [ids[n] for n in rows],
            [hashes[n] for n in rows],
            [self.tokens.get(keys[n], 0) for n in rows],
            [1] * len(rows),
            [ids[n] for n in rows],
            [arrivals[n] for n in rows],
            nothing,
            nothing,
            nothing,
            nothing,
            [False] * len(rows),
        )
        return {row[0] for row in completed}

    async def after(self, batch: list, keys: list[str], started: float) -> None:
        if self.redis is not None:
            pipe = self.redis.pipeline(transaction=False)
            for message, key in zip(batch, keys):
                if "done" in self.knobs:  # the marker takes the lock's place
                    marker = "done:" + hashlib.sha256(message.body).hexdigest()
                    pipe.set(f"{self.namespace}:key:{key}", marker, ex=DONE_SECONDS)
                else:
                    pipe.eval(RELEASE, 1, f"{self.namespace}:key:{key}", self.lock_value)
            await pipe.execute()
        if self.counted is not None:
            elapsed = time.perf_counter() - started
            for message in batch:
                self.counted[0].labels(message.headers["source"], "processed").inc()
                self.counted[1].labels(message.headers["source"]).observe(elapsed)


async def write(database: asyncpg.Connection, batch: list, keys: list[str], guards: Guards) -> None:
    """The completions, the effects of the keys completed now, the archive's rows."""
    source = batch[0].headers["source"]  # one source in the bench
    hashes = [hashlib.sha256(m.body).hexdigest() for m in batch]
    arrivals = [m.headers["arrival"] for m in batch]
    received = [m.headers["received_ms"] for m in batch]
    ids = [m.message_id for m in batch]
    completed = await guards.complete(database, keys, source, ids, hashes, arrivals)
    ran, statuses = {}, []
    for n, key in enumerate(keys):  # a key's first message in the batch is the one that ran
        runs = key in completed and key not in ran
        if runs:
            ran[key] = n
        statuses.append("processed" if runs else "duplicate")
    if ran:
        first = list(ran.values())
        await database.execute(
            INBOX,
            [keys[n] for n in first],
            source,
            [ids[n] for n in first],
            [batch[n].body.decode() for n in first],
            [received[n] for n in first],
        )
    if "no_archive" in guards.knobs:
        return
    await database.execute(
        ARCHIVE,
        keys,
        source,
        received,
        arrivals,
        ids,
        [m.type for m in batch],
        hashes,
        [m.body for m in batch],
        [m.headers["request"] for m in batch],
        statuses,
    )


# --- the bench's side ----------------------------------------------------------------------------------------------


class ContractFloor:
    """Its database (migrated), quorum queue and processes; removed after."""

    def __init__(self, knobs: frozenset[str] = frozenset()) -> None:
        run_id = uuid.uuid4().hex[:8]
        self.database = f"wi_bench_contract_{run_id}"
        self.database_url = SERVER_URL.rsplit("/", 1)[0] + f"/{self.database}"
        self.namespace = f"contract_floor_{run_id}"
        self.queue = f"{self.namespace}.events"
        self.knobs = knobs
        self.port = free_port()
        self.ingresses: list[asyncio.subprocess.Process] = []
        self.consumers: list[asyncio.subprocess.Process] = []

    async def __aenter__(self) -> "ContractFloor":
        await migrate(self.database_url)
        today = datetime.now(UTC).date()
        await fetchval(
            self.database_url,
            "SELECT made FROM event_archive_keep($1, $2, $3, $3, $4)",
            SOURCE,
            SOURCE_TABLE,
            today,
            today + timedelta(days=1),
        )
        connection = await aio_pika.connect(AMQP_URL)
        async with connection:
            channel = await connection.channel()
            await channel.declare_queue(self.queue, durable=True, arguments={"x-queue-type": "quorum"})
        try:
            knobs = ",".join(sorted(self.knobs)) or "-"
            for _ in range(WORKERS):
                self.consumers.append(
                    await self._start(
                        "consume", AMQP_URL, self.queue, self.database_url, str(CONCURRENCY), knobs, self.namespace
                    )
                )
            for _ in range(INGRESS_PROCESSES):
                self.ingresses.append(
                    await self._start("ingress", AMQP_URL, self.queue, str(self.port), SECRET, knobs, self.namespace)
                )
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def _start(self, *argv: str) -> asyncio.subprocess.Process:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tests.bench.contract_floor", *argv, stdout=asyncio.subprocess.PIPE
        )
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        if line.strip() != b"ready":
            process.kill()
            raise RuntimeError(f"contract floor {argv[0]}: {line!r}")
        return process

    def pids(self) -> dict[str, list[int]]:
        return {"ingress": [p.pid for p in self.ingresses], "workers": [p.pid for p in self.consumers]}

    async def rows(self, table: str, prefix: str) -> int:
        return await fetchval(self.database_url, f"SELECT count(*) FROM {table} WHERE key LIKE $1", f"{prefix}%")

    async def until_rows(self, prefix: str, count: int) -> None:
        async def written() -> bool:
            return await self.rows("inbox", f"{SOURCE}:{prefix}") >= count

        await wait_until(written, 180, interval=0.05, message=f"{count} {prefix} rows of the contract floor")

    async def __aexit__(self, *exc) -> None:
        for process in [*self.ingresses, *self.consumers]:
            if process.returncode is None:
                process.terminate()
        for process in [*self.ingresses, *self.consumers]:
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()
        connection = await aio_pika.connect(AMQP_URL)
        async with connection:
            channel = await connection.channel()
            await channel.queue_delete(self.queue)
        server = await asyncpg.connect(SERVER_URL)
        try:
            await server.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        finally:
            await server.close()
        if self.knobs & {"claim", "done"}:
            client = redis.from_url(REDIS_URL)
            try:
                keys = [key async for key in client.scan_iter(match=f"{self.namespace}:*", count=1000)]
                for start in range(0, len(keys), 1000):
                    await client.delete(*keys[start : start + 1000])
            finally:
                await client.aclose()


async def measure(figures: dict, knobs: frozenset[str] = frozenset(), events: int = EVENTS) -> None:
    """`events` unique events, first send to last `inbox` row committed (as
    ours, to its last effect), after WARM_EVENTS; CPU over every process.
    Figures `contract_floor_…`; with knobs, `contract_floor_KNOB_…`."""
    name = "_".join(["contract_floor", *sorted(knobs)])
    async with ContractFloor(knobs) as floor:
        await httpload.closed_loop(floor.port, httpload.signed_requests(SOURCE, SECRET, "warm_", WARM_EVENTS))
        await floor.until_rows("warm_", WARM_EVENTS)
        redis_port = (urlsplit(REDIS_URL).port or 6379) if knobs & {"claim", "done"} else 0
        meter = CpuMeter(floor.pids(), floor.database, redis_port)
        await meter.measure_background()
        requests = httpload.signed_requests(SOURCE, SECRET, "e2e_", events)
        meter.start()
        started = time.perf_counter()
        _, _, statuses = await httpload.closed_loop(floor.port, requests)
        await floor.until_rows("e2e_", events)
        elapsed = time.perf_counter() - started
        shares = meter.stop()
        if set(statuses) != {200}:
            raise SystemExit(f"FAIL: {name}: its ingress answered {statuses}")
        figures[f"{name}_events_per_s"] = events / elapsed
        figures[f"{name}_cpu_ms"] = 1000 * sum(shares.values()) / events
        for process, seconds in shares.items():
            figures[f"{name}_cpu_ms_{process.split('.')[0].replace('-', '_')}"] = 1000 * seconds / events
        prefix = f"{SOURCE}:e2e_"  # the archive's rows commit with the inbox's
        inbox, completions = await floor.rows("inbox", prefix), await floor.rows("processed_events", prefix)
        archived = events if "no_archive" in knobs else await floor.rows("event_archive", prefix)
    figures[f"{name}_lost"] = events - min(inbox, completions, archived)
    figures[f"{name}_extra_rows"] = max(inbox, completions, archived) - events
    figures["lost"] = figures.get("lost", 0) + figures[f"{name}_lost"]
    figures["duplicated_effects"] = figures.get("duplicated_effects", 0) + figures[f"{name}_extra_rows"]


ROWS = [
    ("contract_floor_events_per_s", f"contract floor: events/s end to end ({EVENTS:,} unique)", "{:,.0f}"),
    ("contract_floor_cpu_ms", "contract floor: CPU ms per event, every process", "{:.3f}"),
    ("contract_floor_cpu_ms_ingress", "contract floor: — its ingress", "{:.3f}"),
    ("contract_floor_cpu_ms_workers", "contract floor: — its consumers", "{:.3f}"),
    ("contract_floor_cpu_ms_beam", "contract floor: — the broker", "{:.3f}"),
    ("contract_floor_cpu_ms_postgres", "contract floor: — Postgres", "{:.3f}"),
    ("e2e_vs_contract_floor", "ours end to end / the contract floor's", "{:.2f}"),
    ("cpu_vs_contract_floor", "ours CPU per event / the contract floor's", "{:.2f}"),
]


if __name__ == "__main__":
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    role, arguments = sys.argv[1], sys.argv[2:]
    chosen = frozenset(knob for knob in arguments[4].split(",") if knob in KNOBS)
    if role == "ingress":
        asyncio.run(serve(arguments[0], arguments[1], int(arguments[2]), arguments[3], chosen, arguments[5]))
    else:
        asyncio.run(consume(arguments[0], arguments[1], arguments[2], int(arguments[3]), chosen, arguments[5]))
