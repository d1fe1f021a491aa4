"""A typical Celery stack for webhooks, as a team would write it:

- an ASGI receiver (Starlette under uvicorn, one process per core) that
  checks the HMAC of the raw body, as our `hmac-sha256` scheme signs it,
  and enqueues a task with `.delay()` from a threadpool endpoint;
- a Celery worker (prefork, one child per core, `acks_late` so a killed
  child's task is redelivered, prefetch multiplier 1) whose task inserts
  the event's row into Postgres — a plain INSERT, as most do, so a task
  run twice shows as a second row; events of the source `calls` go to a
  task that first calls a downstream (tests/bench/peers/downstream.py),
  as our `call_then_record` does.

Broker: the same RabbitMQ (PEER_AMQP_URL); rows: PEER_DATABASE_URL;
secret: PEER_SECRET. `uvicorn tests.bench.peers.celery_stack:receiver` and
`celery -A tests.bench.peers.celery_stack worker`."""

import hashlib
import hmac
import json
import os

import psycopg
from celery import Celery
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from tests.bench.peers import downstream

SECRET = os.environ.get("PEER_SECRET", "bench-secret").encode()

app = Celery("peer", broker=os.environ.get("PEER_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//"))
app.conf.update(
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_default_queue=os.environ.get("PEER_QUEUE", "peer_celery"),
    broker_connection_retry_on_startup=True,
    broker_transport_options={"confirm_publish": True},
)  # 200 only once the broker has it, as ours
_connection: psycopg.Connection | None = None


def _database() -> psycopg.Connection:
    global _connection
    if _connection is None or _connection.closed:
        _connection = psycopg.connect(os.environ["PEER_DATABASE_URL"], autocommit=True)
    return _connection


def _insert(key: str, body: str) -> None:
    _database().execute("INSERT INTO peer_effects (key, payload) VALUES (%s, %s)", (key, body))


@app.task(name="peer.record")
def record(key: str, body: str) -> None:
    _insert(key, body)


@app.task(name="peer.call_then_record")
def call_then_record(key: str, body: str) -> None:
    """The pause step's handler, as our `call_then_record`: the downstream's call, then the row."""
    downstream.call(key, body)
    _insert(key, body)


async def receive(request: Request) -> JSONResponse:
    """200 once the broker has the task (`.delay()` blocks: in the threadpool)."""
    body = await request.body()
    expected = "sha256=" + hmac.new(SECRET, body, hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, request.headers.get("x-signature", "")):
        return JSONResponse({"error": "bad signature"}, status_code=401)
    source = request.path_params["source"]
    task = call_then_record if source == downstream.CALLING_SOURCE else record
    await run_in_threadpool(task.delay, f"{source}:{json.loads(body)['id']}", body.decode())
    return JSONResponse({"status": "accepted"})


receiver = Starlette(routes=[Route("/webhooks/{source}", receive, methods=["POST"])])
