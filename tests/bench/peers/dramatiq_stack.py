"""A typical Dramatiq stack for webhooks, as a team would write it, the
Celery stack's (celery_stack.py) twin:

- the same ASGI receiver (Starlette under uvicorn, one process per core)
  checking the HMAC of the raw body, then `record.send()` from a
  threadpool endpoint (pika's blocking connection, one per thread);
- Dramatiq's RabbitMQ broker with publisher confirms (200 only once the
  broker has the message, as ours), persistent messages on its own
  durable queue (classic, as Dramatiq declares it);
- `dramatiq` workers (one process per core, its default 8 threads each,
  acking after the actor returns, so a killed process's messages are
  redelivered) whose actor inserts the event's row into Postgres with a
  plain INSERT, so a message run twice shows as a second row; events of
  the source `calls` go to an actor that first calls a downstream
  (tests/bench/peers/downstream.py), as our `call_then_record` does.

Broker: PEER_AMQP_URL; rows: PEER_DATABASE_URL; secret: PEER_SECRET; queue:
PEER_QUEUE. `uvicorn tests.bench.peers.dramatiq_stack:receiver` and
`dramatiq tests.bench.peers.dramatiq_stack`."""

import hashlib
import hmac
import json
import os
import threading

import dramatiq
import psycopg
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.bench.peers import downstream

SECRET = os.environ.get("PEER_SECRET", "bench-secret").encode()
QUEUE = os.environ.get("PEER_QUEUE", "peer_dramatiq")

dramatiq.set_broker(
    RabbitmqBroker(url=os.environ.get("PEER_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), confirm_delivery=True)
)
_local = threading.local()  # a worker's threads each have their own connection


def _database() -> psycopg.Connection:
    connection = getattr(_local, "connection", None)
    if connection is None or connection.closed:
        connection = _local.connection = psycopg.connect(os.environ["PEER_DATABASE_URL"], autocommit=True)
    return connection


def _insert(key: str, body: str) -> None:
    _database().execute("INSERT INTO peer_effects (key, payload) VALUES (%s, %s)", (key, body))


@dramatiq.actor(queue_name=QUEUE)
def record(key: str, body: str) -> None:
    _insert(key, body)


@dramatiq.actor(queue_name=QUEUE)
def call_then_record(key: str, body: str) -> None:
    """The pause step's handler, as our `call_then_record`: the downstream's call, then the row."""
    downstream.call(key, body)
    _insert(key, body)


async def receive(request: Request) -> JSONResponse:
    """200 once the broker has the message (`.send()` blocks: in the threadpool)."""
    body = await request.body()
    expected = "sha256=" + hmac.new(SECRET, body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, request.headers.get("x-signature", "")):
        return JSONResponse({"error": "bad signature"}, status_code=401)
    source = request.path_params["source"]
    task = call_then_record if source == downstream.CALLING_SOURCE else record
    await run_in_threadpool(task.send, f"{source}:{json.loads(body)['id']}", body.decode())
    return JSONResponse({"status": "accepted"})


receiver = Starlette(routes=[Route("/webhooks/{source}", receive, methods=["POST"])])
