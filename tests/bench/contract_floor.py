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

`python -m tests.bench.contract_floor ingress AMQP_URL QUEUE PORT SECRET`
and `… consume AMQP_URL QUEUE DATABASE_URL PREFETCH` are its processes;
each prints `ready`."""

import asyncio
import hashlib
import hmac
import os
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta

import aio_pika
import asyncpg
import orjson

from tests.bench import httpload
from tests.bench.cpu import CpuMeter
from tests.bench.deployment import AMQP_URL, CONCURRENCY, INGRESS_PROCESSES, SECRET, SERVER_URL, WORKERS, fetchval
from tests.support.processes import wait_until
from tests.support.tcpproxy import free_port
from webhook_ingest.cli.migrate import migrate

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


# --- the ingress ---------------------------------------------------------------------------------------------------


async def serve(amqp_url: str, queue: str, port: int, secret: str) -> None:
    from aiohttp import web

    connection = await aio_pika.connect(amqp_url)
    channel = await connection.channel(publisher_confirms=True)
    exchange, key = channel.default_exchange, secret.encode()
    arrivals = iter(range(os.getpid() << 32, (os.getpid() + 1) << 32))

    async def receive(request: web.Request) -> web.Response:
        body = await request.read()
        expected = "sha256=" + hmac.new(key, body, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, request.headers.get("X-Signature", "")):
            return web.json_response({"error": "bad signature"}, status=401)
        event = orjson.loads(body)
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
        return web.Response(body=ACCEPTED, content_type="application/json")

    app = web.Application()
    app.router.add_post("/webhooks/{source}", receive)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, reuse_port=True).start()
    print("ready", flush=True)
    await asyncio.Event().wait()


# --- the consumer --------------------------------------------------------------------------------------------------


async def consume(amqp_url: str, queue_name: str, database_url: str, prefetch: int) -> None:
    database = await asyncpg.connect(database_url)
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
        async with database.transaction():
            await write(database, batch)
        await batch[-1].ack(multiple=True)  # one writer: every earlier delivery is committed too


async def write(database: asyncpg.Connection, batch: list) -> None:
    """The completions, the effects of the keys completed now, the archive's rows."""
    source = batch[0].headers["source"]  # one source in the bench
    keys = [f"{m.headers['source']}:{m.message_id}" for m in batch]
    hashes = [hashlib.sha256(m.body).hexdigest() for m in batch]
    arrivals = [m.headers["arrival"] for m in batch]
    received = [m.headers["received_ms"] for m in batch]
    ids = [m.message_id for m in batch]
    completed = {row[0] for row in await database.fetch(COMPLETE, keys, source, ids, hashes, arrivals)}
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

    def __init__(self) -> None:
        run_id = uuid.uuid4().hex[:8]
        self.database = f"wi_bench_contract_{run_id}"
        self.database_url = SERVER_URL.rsplit("/", 1)[0] + f"/{self.database}"
        self.queue = f"contract_floor_{run_id}.events"
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
            for _ in range(WORKERS):
                self.consumers.append(
                    await self._start("consume", AMQP_URL, self.queue, self.database_url, str(CONCURRENCY))
                )
            for _ in range(INGRESS_PROCESSES):
                self.ingresses.append(await self._start("ingress", AMQP_URL, self.queue, str(self.port), SECRET))
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


async def measure(figures: dict) -> None:
    """EVENTS unique events, first send to last `inbox` row committed (as
    ours, to its last effect), after WARM_EVENTS; CPU over every process."""
    async with ContractFloor() as floor:
        await httpload.closed_loop(floor.port, httpload.signed_requests(SOURCE, SECRET, "warm_", WARM_EVENTS))
        await floor.until_rows("warm_", WARM_EVENTS)
        meter = CpuMeter(floor.pids(), floor.database, 0)  # no Redis
        await meter.measure_background()
        requests = httpload.signed_requests(SOURCE, SECRET, "e2e_", EVENTS)
        meter.start()
        started = time.perf_counter()
        _, _, statuses = await httpload.closed_loop(floor.port, requests)
        await floor.until_rows("e2e_", EVENTS)
        elapsed = time.perf_counter() - started
        shares = meter.stop()
        if set(statuses) != {200}:
            raise SystemExit(f"FAIL: contract floor: its ingress answered {statuses}")
        figures["contract_floor_events_per_s"] = EVENTS / elapsed
        figures["contract_floor_cpu_ms"] = 1000 * sum(shares.values()) / EVENTS
        for name, seconds in shares.items():
            figures[f"contract_floor_cpu_ms_{name.split('.')[0].replace('-', '_')}"] = 1000 * seconds / EVENTS
        await asyncio.sleep(0.5)  # the last batch's archive rows, written in its transaction, are there already
        prefix = f"{SOURCE}:e2e_"
        inbox, completions = await floor.rows("inbox", prefix), await floor.rows("processed_events", prefix)
        archived = await floor.rows("event_archive", prefix)
    figures["contract_floor_lost"] = EVENTS - min(inbox, completions, archived)
    figures["contract_floor_extra_rows"] = max(inbox, completions, archived) - EVENTS
    figures["lost"] = figures.get("lost", 0) + figures["contract_floor_lost"]
    figures["duplicated_effects"] = figures.get("duplicated_effects", 0) + figures["contract_floor_extra_rows"]


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
    if role == "ingress":
        asyncio.run(serve(arguments[0], arguments[1], int(arguments[2]), arguments[3]))
    else:
        asyncio.run(consume(arguments[0], arguments[1], arguments[2], int(arguments[3])))
