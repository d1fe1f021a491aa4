"""The Postgres outbox: where the ingress keeps an event the broker did not
confirm (docs/reference.md §6, "When RabbitMQ is away").

A row is the message the ingress would have published — the body and the
AMQP header table that `to_amqp` builds, in pamqp's wire encoding — so the
relay republishes through `from_amqp`/`to_amqp` and whatever the message
format carries (receive time, provider headers, message id) survives the
detour exactly as it survives the broker. The relay is in `relay.py`.

Inserts made at the same time share one statement and one commit
(`shared/db/group_commit.py`): when the broker goes away, a whole process's traffic
turns to the outbox at once, and one commit per event would fall behind.
"""

import asyncio

import asyncpg
from aiohttp import web
from pamqp import decode, encode

from webhook_ingest.shared.db import GroupCommit, load_queries, pooled
from webhook_ingest.shared.errors import ServiceUnavailable, describe
from webhook_ingest.shared.event import EventMessage, from_amqp, to_amqp
from webhook_ingest.shared.observability import tracing
from webhook_ingest.shared.service_errors import POSTGRES_ERRORS

QUERIES = load_queries("webhook_ingest.ingress")
TIMEOUT_SECONDS = 5.0
READY_TIMEOUT_SECONDS = 1.0  # a readiness probe's own default timeout is 1 s
WRITERS, MAX_BATCH = 3, 100  # inserts at once, and events in one; the pool keeps others for the relay and the API
Row = tuple[str, str, str, str, bytes, bytes]


class OutboxUnavailable(ServiceUnavailable):
    """The outbox insert did not commit: the event is stored nowhere."""


class Outbox:
    def __init__(self, pool: asyncpg.Pool):
        self.pool = pool
        self.stored = asyncio.Event()  # set on every insert here: wakes this process's relay
        writers = min(WRITERS, pool.get_max_size() - 2)  # at least 1 (WEBHOOK_INGEST_INGRESS_CONNECTIONS >= 3)
        self._inserts: GroupCommit[Row, None] = GroupCommit(self._insert, writers, MAX_BATCH)

    async def store(self, event: EventMessage) -> None:
        """Returns once a committed insert holds the event; raises
        OutboxUnavailable when it did not commit. A traced event's row
        carries this step's span as its message's parent: the relay's
        publish continues the request's trace."""
        with tracing.span("outbox store", event, failed_by_errors=True):
            try:
                await self._inserts.submit(outbox_row(tracing.carried(event)))
            except POSTGRES_ERRORS as exc:
                raise OutboxUnavailable(describe(exc)) from exc
        self.stored.set()

    async def _insert(self, rows: list[Row]) -> None:
        async with pooled(self.pool, TIMEOUT_SECONDS) as connection:
            await connection.execute(QUERIES["store_in_outbox"], *outbox_columns(rows), timeout=TIMEOUT_SECONDS)

    async def writable(self) -> bool:
        """For /readyz: could an insert commit now?"""
        try:
            async with asyncio.timeout(READY_TIMEOUT_SECONDS), pooled(self.pool, None) as connection:
                return bool(await connection.fetchval(QUERIES["outbox_writable"]))
        except POSTGRES_ERRORS:
            return False


def outbox_row(event: EventMessage) -> Row:
    return (event.key, event.source, event.event_id, event.payload_sha256, *encode_message(event))


def outbox_columns(rows: list[Row]) -> list[list]:
    """The arguments of `store_in_outbox`: one list per column."""
    return [list(column) for column in zip(*rows)]


def encode_message(event: EventMessage) -> tuple[bytes, bytes]:
    """(body, header table) of the AMQP message `event` would be published as."""
    message = to_amqp(event)
    return message.body, encode.field_table(message.headers)


def decode_message(body: bytes, amqp_headers: bytes) -> EventMessage:
    _, headers = decode.field_table(amqp_headers)
    return from_amqp(body, headers)


outbox_key = web.AppKey("outbox", Outbox)
