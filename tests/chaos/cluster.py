"""`make chaos-cluster`: the pipeline on a three-node RabbitMQ cluster loses
a node and then has another restarted, while events keep coming; nothing
of ours is restarted.

Three private RabbitMQ nodes (tests/support/rabbit_cluster.py, never the
shared broker), a private Redis, this run's own database; one ingress and
two workers whose `AMQP_URL` lists the three nodes. Events are posted at a
steady rate through the ingress. A third of the way, node 1 (the one every
process connected to first) is SIGKILLed; two thirds of the way, node 2 is
stopped and started again, which leaves one node of three for a while: the
quorum queues stop, the ingress keeps answering 200 from its outbox, the
workers wait. At the end node 1 comes back. Then every event answered 200
must have run its handler exactly once, and nothing may be left in a queue
or the outbox. Heavy on two cores (three Erlang VMs): not part of `make test`.
"""

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import aiohttp
import asyncpg
import orjson

from tests.support.exactly_once import SECRET, effects_by_key, metered_worker, write_sources
from tests.support.handlers import EFFECTS_TABLES
from tests.support.processes import Fleet, count_rows, wait_for_output, wait_until
from tests.support.rabbit_cluster import RabbitCluster
from tests.support.redis_server import RedisServer
from webhook_ingest.cli.migrate import migrate
from webhook_ingest.shared import signatures
from webhook_ingest.shared.broker import amqp, topology

SERVER_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


class Timeline:
    def __init__(self):
        self.started = time.monotonic()
        self.lines: list[str] = []

    def note(self, what: str) -> None:
        line = f"{time.monotonic() - self.started:6.1f}s  {what}"
        self.lines.append(line)
        print(line, flush=True)


async def run(events: int, rate: float) -> int:
    timeline = Timeline()
    run_id = uuid.uuid4().hex[:8]
    namespace, database = f"cluster_{run_id}", f"wi_cluster_{run_id}"
    database_url = SERVER_URL.rsplit("/", 1)[0] + "/" + database
    with tempfile.TemporaryDirectory(prefix="wi-chaos-cluster-") as folder, RedisServer() as redis_server:
        timeline.note("starting three RabbitMQ nodes")
        with RabbitCluster() as cluster:
            timeline.note(f"cluster formed: {', '.join(node.name for node in cluster.nodes)}")
            await migrate(database_url)
            try:
                await _execute(database_url, EFFECTS_TABLES)
                env = {
                    "AMQP_URL": cluster.amqp_url,
                    "REDIS_URLS": redis_server.url,
                    "DATABASE_URL": database_url,
                    "WEBHOOK_INGEST_NAMESPACE": namespace,
                    "LOG_FORMAT": "json",
                    "WEBHOOK_INGEST_SOURCES": write_sources(
                        Path(folder) / "s.toml", "tests.support.handlers:slow_inbox"
                    ),
                }
                fleet = Fleet(env, Path(folder))
                try:
                    return await _scenario(fleet, env, cluster, database_url, namespace, events, rate, timeline)
                finally:
                    fleet.stop_all()
            finally:
                await _execute(SERVER_URL, f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


async def _scenario(fleet, env, cluster, database_url, namespace, events, rate, timeline) -> int:
    ingress, base_url = fleet.ingress()
    workers = [metered_worker(fleet, env, "--concurrency", "16") for _ in range(2)]
    for worker, _ in workers:
        await wait_for_output(worker, "worker_consuming", timeout=60)
    await wait_for_output(ingress, "broker_connected", timeout=60)
    timeline.note(f"ingress and 2 workers up; posting {events} events at {rate:g}/s")

    first, second = cluster.nodes[0], cluster.nodes[1]
    faults = [
        (events // 3, f"SIGKILL {first.name}", first.kill),
        (2 * events // 3, f"restart {second.name}", lambda: (second.stop(), second.start())),
    ]
    statuses = await _post_at_rate(base_url, events, rate, faults, timeline)
    timeline.note(f"traffic done: {dict(statuses)}")
    await asyncio.to_thread(first.start)
    timeline.note(f"{first.name} back")

    await wait_until(
        lambda: _settled(database_url, cluster, namespace, statuses[200]),
        300,
        interval=1,
        message="every accepted event processed, queue and outbox empty",
    )
    await asyncio.sleep(2)  # a late copy would show now
    return await _verdict(database_url, events, statuses, ingress, timeline)


async def _post_at_rate(base_url, events, rate, faults, timeline) -> Counter:
    statuses: Counter = Counter()
    pending_faults = list(faults)
    fault_tasks = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:

        async def post(n: int) -> None:
            body = orjson.dumps({"id": f"evt_{n}", "type": "cluster.test"})
            headers = signatures.sign("hmac-sha256", body, SECRET) | {"Content-Type": "application/json"}
            try:
                async with session.post(f"{base_url}/webhooks/acme", data=body, headers=headers) as response:
                    await response.read()
                    statuses[response.status] += 1
            except aiohttp.ClientError as exc:
                statuses[type(exc).__name__] += 1

        posts = []
        for n in range(events):
            if pending_faults and sum(statuses.values()) >= pending_faults[0][0]:
                _, what, action = pending_faults.pop(0)
                timeline.note(what)
                fault_tasks.append(asyncio.create_task(_timed(action, what, timeline)))
            posts.append(asyncio.create_task(post(n)))
            await asyncio.sleep(1 / rate)
        await asyncio.gather(*posts, *fault_tasks)
    return statuses


async def _timed(action, what: str, timeline: Timeline) -> None:
    await asyncio.to_thread(action)
    timeline.note(f"done: {what}")


async def _settled(database_url, cluster, namespace, accepted: int) -> bool:
    if await count_rows(database_url, "processed_events") < accepted:
        return False
    if await count_rows(database_url, "outbox") > 0:
        return False
    connection = await amqp.connect(cluster.amqp_url)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(topology.events_queue(namespace), passive=True)
        return queue.declaration_result.message_count == 0


async def _verdict(database_url, events, statuses, ingress, timeline) -> int:
    runs = await effects_by_key(database_url)
    twice = sorted(key for key, count in runs.items() if count > 1)
    lost = sorted(f"acme:evt_{n}" for n in range(events) if f"acme:evt_{n}" not in runs)
    outboxed = ingress.output().count('"stored_in_outbox"')
    print("\n== cluster fault run ==")
    print(f"events posted {events}; answers {dict(statuses)}; stored in the outbox on the way {outboxed}")
    print(f"handler runs {sum(runs.values())} over {len(runs)} keys; run twice {len(twice)}; never run {len(lost)}")
    failures = []
    if statuses[200] != events:
        failures.append(f"not every delivery answered 200: {dict(statuses)}")
    if twice:
        failures.append(f"run twice: {twice[:10]}")
    if lost:
        failures.append(f"accepted, never run: {lost[:10]}")
    print("\n".join(["FAIL: " + failure for failure in failures] or ["PASS: nothing lost, nothing twice"]))
    return 1 if failures else 0


async def _execute(database_url: str, sql: str) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(sql)
    finally:
        await connection.close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1500, help="events posted through the ingress")
    parser.add_argument("--rate", type=float, default=100.0, help="events per second")
    arguments = parser.parse_args(argv)
    return asyncio.run(run(arguments.events, arguments.rate))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
