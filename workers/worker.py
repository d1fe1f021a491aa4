"""`webhook-ingest worker`: one consumer process; run as many as you like.

Lifetimes: `run()` opens Postgres, Redis and RabbitMQ (waiting for any that
is down), consumes until `stop()` (SIGTERM/SIGINT), then shuts down: stop
taking messages, let running handlers finish within the grace period, cancel
the rest (unacked, so the broker redelivers them elsewhere), close.
"""

import asyncio
import contextlib
import os
import signal
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import aio_pika
import asyncpg
import structlog
from aio_pika.abc import AbstractIncomingMessage

from webhook_ingest.shared import backoff
from webhook_ingest.shared.archive import ArchiveStore
from webhook_ingest.shared.broker import amqp, topology
from webhook_ingest.shared.db import close_pool, pooler, schema
from webhook_ingest.shared.dead_letters import DeadLetterStore
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.event import EventMessage, from_amqp
from webhook_ingest.shared.incidents import IncidentStore
from webhook_ingest.shared.observability import get_logger, metrics, tracing
from webhook_ingest.shared.settings import Settings
from webhook_ingest.shared.sources import Source
from webhook_ingest.shared.worker_heartbeats import Figures, HeartbeatStore
from webhook_ingest.workers.claim import (
    DEFER_SECONDS,
    ArchiveNotes,
    BatchProcessor,
    CompletionStore,
    CopiesInFlight,
    FailurePolicy,
    IdempotencyStore,
    Outcome,
    Processor,
    WorkerCompletionsPort,
)
from webhook_ingest.workers.failures import IncidentCounts, Notifier, OutageGate, outage_kind, targets_from

from . import connection_budget
from .acks import OpenDeliveries
from .delivery_rate import shared_buckets
from .fan_out import route_messages
from .heartbeat import Heartbeat
from .ordering import LaneHeads, LaneRunner, LaneStore, OrderedFailurePolicy
from .pauses import Parking, PausedSources, keep_pauses

log = get_logger(__name__)

SERVER_KEEPALIVES = "SET tcp_keepalives_idle = 10; SET tcp_keepalives_interval = 5; SET tcp_keepalives_count = 3"
PARALLEL_BATCHES = 2  # one in Postgres while the next one's Redis claims are on the wire
COUNTS_FLUSH_SECONDS = 2.0  # a stopping worker's last incident counts
UNKNOWN_SOURCE_RETRY = 5.0  # seconds between looks for a worker that knows the source
UNKNOWN_SOURCE_PATIENCE = 600.0  # seconds since a worker first did not know it, then a dead letter
WAKE_UP_PREFETCH = 64  # NS.ordering: acked at once, so this only paces the offers


class Worker:
    def __init__(
        self,
        settings: Settings,
        sources: dict[str, Source],
        concurrency: int = 16,
        grace_seconds: float = 30.0,
        name: str = "worker",
    ):
        self.settings = settings
        self.sources = sources
        self.concurrency = concurrency
        self.grace_seconds = grace_seconds
        self.name = name
        self.ready = False
        self._stopping = asyncio.Event()
        self._in_flight: set[asyncio.Task] = set()
        self._pending: list[tuple[AbstractIncomingMessage, EventMessage]] = []
        self._running_batches = 0
        self._copies = CopiesInFlight()
        self._deliveries = OpenDeliveries()  # what a batch's one `multiple` ack may cover
        self.heartbeat: Heartbeat | None = None  # started with the side tasks
        self.pool_sizes = connection_budget.split(settings.worker_connections, concurrency)

    def stop(self) -> None:
        self._stopping.set()

    async def run(self) -> None:
        async with contextlib.AsyncExitStack() as stack:
            # four pools, so that nothing short waits behind something long (workers.claim.completions),
            # and no bookkeeping in the claim path's way; together within the budget (workers.connection_budget)
            sizes = self.pool_sizes
            # TransactionPooler (a ConfigError): not retried
            await _wait_for("postgres", lambda: pooler.refuse_transaction_pooling(self.settings.database_url))
            self.pool = await _wait_for("postgres", lambda: self._open_pool(sizes.statements, kept_open=True))
            stack.push_async_callback(close_pool, self.pool)  # within 2 s, whatever the server does
            await _wait_for("postgres", lambda: schema.require_migrations(self.pool))  # SchemaBehind: not retried
            self.transactions = await _wait_for("postgres", lambda: self._open_pool(sizes.transactions))
            stack.push_async_callback(close_pool, self.transactions)
            self.renewals = await _wait_for("postgres", lambda: self._open_pool(sizes.renewals, kept_open=True))
            stack.push_async_callback(close_pool, self.renewals)
            self.bookkeeping = await _wait_for("postgres", lambda: self._open_pool(sizes.bookkeeping))
            stack.push_async_callback(close_pool, self.bookkeeping)
            self.store = IdempotencyStore(
                self.settings.redis_urls, self.settings.namespace, self.settings.lock_ttl, self.settings.done_ttl
            )
            stack.push_async_callback(self.store.close)
            self.connection = await _wait_for("rabbitmq", self._connect_broker)
            stack.push_async_callback(self.connection.close)
            stack.push_async_callback(_close_forward_session)
            shared_buckets.open(self.settings.redis_urls[0], self.settings.namespace)  # forward's rate_limit
            stack.push_async_callback(shared_buckets.close)
            await self._consume_until_stopped()

    async def _open_pool(self, size: int, kept_open: bool = False) -> asyncpg.Pool:
        """`kept_open`: the claim path's pools hold their budgeted sessions
        from the start and never close one for idling (asyncpg's 300 s), so
        a burst after a quiet spell needs no new session from a server that
        may be full by then (docs/design.md, "The claim path owns its resources")."""
        if kept_open:
            return await asyncpg.create_pool(
                self.settings.database_url,
                min_size=size,
                max_size=size,
                max_inactive_connection_lifetime=0,
                reset=_keep_session,
                init=_server_keepalives,
            )
        return await asyncpg.create_pool(
            self.settings.database_url, min_size=1, max_size=size, reset=_keep_session, init=_server_keepalives
        )

    async def _connect_broker(self):
        return await amqp.connect_robust(self.settings.amqp_url, client_properties={"connection_name": self.name})

    async def _consume_until_stopped(self) -> None:
        publish_channel = await self.connection.channel(publisher_confirms=True, on_return_raises=True)
        consume_channel = await self.connection.channel()
        # a consumer's prefetch is its own (quorum queues have no channel-wide one):
        # with N partitions each takes a share of the concurrency
        await consume_channel.set_qos(prefetch_count=max(1, self.concurrency // topology.event_queues()))
        queues = await self._declare_queues(consume_channel)
        self.incident_counts = IncidentCounts(self.bookkeeping)
        self.failures = FailurePolicy(publish_channel, self.pool, self.settings.namespace, self.incident_counts)
        self.paused = PausedSources(self.pool)
        await _wait_for("postgres", self.paused.refresh)  # a paused source is never run, from the first message
        # the simulation swaps CompletionStore for its own (tests/sim/patches.py): the port is what this asks
        self.completions: WorkerCompletionsPort[Any] = CompletionStore(self.pool, self.renewals, self.transactions)
        self.archive = ArchiveNotes(ArchiveStore(self.bookkeeping), self.sources)
        self.processor = Processor(
            self.sources,
            self.store,
            self.completions,
            self.failures,
            self.archive,
            renewal_writers=self.pool_sizes.renewals,
        )
        self.batch_processor = BatchProcessor(self.processor, self.store, self.completions)
        self.lanes = self._lane_runner()
        self._gates = {
            "postgres": OutageGate(self._probe_postgres, "postgres"),
            "rabbitmq": OutageGate(self._probe_broker, "rabbitmq"),
        }
        wake_ups = await self._declare_wake_ups()  # before the side tasks: none of their basic.gets beside it
        side_tasks = await self._start_side_tasks()
        wake_up_tag = await wake_ups.consume(self._on_wake_up)
        consumer_tags = [await queue.consume(self._on_message) for queue in queues]
        self.ready = True
        log.info(
            "worker_consuming",
            queue=",".join(queue.name for queue in queues),
            concurrency=self.concurrency,
            postgres_connections=self.pool_sizes._asdict(),
        )
        await self._wait_for_stop(side_tasks)
        self.ready = False
        for queue, consumer_tag in zip(queues, consumer_tags, strict=True):
            await queue.cancel(consumer_tag)
        await wake_ups.cancel(wake_up_tag)
        self._copies.abandon([event for _, event in self._pending])  # never started: redelivered
        await asyncio.gather(self._drain_in_flight(), self.lanes.stop(self.grace_seconds))
        await self.archive.close()  # what the runs settled, written first
        await self.incident_counts.flush(COUNTS_FLUSH_SECONDS)
        for task in side_tasks:
            task.cancel()
        await asyncio.gather(*side_tasks, return_exceptions=True)
        if self.heartbeat is not None:
            await self.heartbeat.stopped()

    def _lane_runner(self) -> LaneRunner:
        """Ordering keys' lanes (workers/ordering/): their rows run through a
        Processor of their own, whose failures are retried in place."""
        lane_store = LaneStore(self.pool)
        ordered_failures = OrderedFailurePolicy(lane_store, self.failures, self.incident_counts)
        self.ordered_processor = Processor(
            self.sources,
            self.store,
            self.completions,
            ordered_failures,
            self.archive,
            renewal_writers=self.pool_sizes.renewals,
            open_early=max(1, self.pool_sizes.transactions // 4),
        )
        return LaneRunner(
            lane_store,
            self.ordered_processor.run_ordered,
            self.sources,
            self.paused,
            holder=f"{self.name}/{os.getpid()}",
            capacity=self.concurrency,
            ttl_ms=self.store.redlock.ttl_ms,
            settled=self._settled,
            until_done=self._until_done,
            dead_unrun=ordered_failures.dead_unrun,
            delivery_limit=self.settings.delivery_limit,
            pages=self.ordered_processor,
            heads=LaneHeads(
                BatchProcessor(self.ordered_processor, self.store, self.completions), self.ordered_processor.batchable
            ),
        )

    async def _declare_wake_ups(self):
        """NS.ordering, whose wake-ups are consumed on a channel of their own
        (never below a batch's `multiple` ack), each acked at once: the
        lane's rows are in Postgres, a wake-up is a hint."""
        channel = await self.connection.channel()
        await channel.set_qos(prefetch_count=WAKE_UP_PREFETCH)
        return await topology.declare_ordering_queue(channel, self.settings.namespace)

    async def _on_wake_up(self, message: AbstractIncomingMessage) -> None:
        lane = topology.woken_lane(message)
        await message.ack()
        if lane is not None:
            self.lanes.offer(lane)

    async def _declare_queues(self, channel) -> list:
        """Every partition of the events queue (one, `NS.events`, by default), each with its retry queues."""
        namespace, queues = self.settings.namespace, []
        delays = {DEFER_SECONDS, UNKNOWN_SOURCE_RETRY, *(d for s in self.sources.values() for d in s.retry_delays)}
        for partition in topology.partitions():
            queue, as_configured = await topology.declare_events_queue_to_consume(
                self.connection, channel, namespace, self.settings.delivery_limit, partition
            )
            if not as_configured:  # our own count still stops a message at our limit (`_decode`)
                log.warning(
                    "events_queue_kept_its_arguments", queue=queue.name, delivery_limit=self.settings.delivery_limit
                )
            for delay in sorted(delays):
                await topology.declare_retry_queue(channel, namespace, delay, partition)
            queues.append(queue)
        return queues

    async def _start_side_tasks(self) -> list[asyncio.Task]:
        from .poison import drain_poison_queue

        self.archive.start()
        # A channel of its own: its deliveries must never sit below a batch's
        # `multiple` ack on the consume channel (workers.acks).
        poison_channel = await self.connection.channel()
        await drain_poison_queue(
            poison_channel,
            self.pool,
            self.settings.namespace,
            self.settings.delivery_limit,
            frozenset(name for name, source in self.sources.items() if source.routes),
        )
        # Its basic.gets too: a channel of its own.
        self.parking = Parking(await self.connection.channel(), self.failures, self.settings.namespace, self.sources)
        await self.parking.declare()
        quiet_seconds = self.settings.incident_quiet_minutes * 60
        # On the bookkeeping pool: never a connection of the claim path's.
        self.heartbeat = Heartbeat(
            HeartbeatStore(self.bookkeeping), self.name, self.settings.heartbeat_seconds, self._heartbeat_figures
        )
        return [
            asyncio.create_task(self.heartbeat.run(), name="heartbeat"),
            asyncio.create_task(self.incident_counts.run(), name="incident-counts"),
            asyncio.create_task(DeadLetterStore(self.bookkeeping).keep_open_gauge(), name="dead-letters-gauge"),
            asyncio.create_task(
                IncidentStore(self.bookkeeping).keep_resolving(quiet_seconds), name="incident-resolver"
            ),
            asyncio.create_task(
                Notifier(self.bookkeeping, targets_from(self.settings)).run_forever(), name="incident-notifier"
            ),
            asyncio.create_task(keep_pauses(self.paused, self.parking), name="pauses"),
            asyncio.create_task(self.lanes.watch(), name="ordering-watchdog"),
        ]

    def _heartbeat_figures(self) -> Figures:
        claim_pools = (self.pool, self.transactions, self.renewals)
        return Figures(
            self._deliveries.open_count(),
            self._copies.keys_led() + self.lanes.held(),
            sum(pool.get_size() - pool.get_idle_size() for pool in claim_pools),
            sum(pool.get_max_size() for pool in claim_pools),
            self.store.degraded,
        )

    async def _wait_for_stop(self, side_tasks: list[asyncio.Task]) -> None:
        """Until stop(); a side task that dies stops the worker too."""
        stop = asyncio.create_task(self._stopping.wait())
        done, _ = await asyncio.wait([stop, *side_tasks], return_when=asyncio.FIRST_COMPLETED)
        if stop not in done:
            stop.cancel()
            crashed = next(iter(done))
            log.error("side_task_crashed", task=crashed.get_name(), error=repr(crashed.exception()))

    async def _drain_in_flight(self) -> None:
        if not self._in_flight:
            return
        log.info("worker_draining", in_flight=len(self._in_flight), grace_seconds=self.grace_seconds)
        _, unfinished = await asyncio.wait(self._in_flight, timeout=self.grace_seconds)
        for task in unfinished:
            task.cancel()
        await asyncio.gather(*unfinished, return_exceptions=True)
        if unfinished:
            log.warning("handlers_cancelled_at_grace_end", count=len(unfinished))

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        self._deliveries.delivered(message)
        event = await self._decode(message)
        if event is not None:
            self._dispatch(message, event)

    def _dispatch(self, message: AbstractIncomingMessage, event: EventMessage) -> None:
        if message.redelivered:  # alone, so its earlier delivery's settlement is looked up
            self._track(self._handle(message, event), event)
            return
        leader = self._copies.leader(event.key)
        if leader is not None:
            self._track(self._follow(leader, message, event), event)
            return
        self._copies.lead(event)
        if not self.processor.batchable(event):
            self._track(self._handle(message, event), event)
            return
        self._pending.append((message, event))
        self._start_batches()

    def _track(self, coroutine, event: EventMessage | None = None) -> None:
        """`coroutine` as a task of its own, in `event`'s trace (its log lines and spans)."""
        task = asyncio.create_task(coroutine if event is None else tracing.within(event, coroutine))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _decode(self, message: AbstractIncomingMessage) -> EventMessage | None:
        """The event, or None once an unusable message is rejected to NS.dead."""
        try:
            event = replace(from_amqp(message.body, message.headers), message_id=message.message_id or "")
        except (KeyError, ValueError, TypeError):
            log.error("unreadable_message", message_id=message.message_id)
            await self._deliveries.reject(message)  # the drainer records it
            return None
        if event.deliveries > self.settings.delivery_limit:  # the queue's limit, counted across deferrals
            await self._deliveries.reject(message)  # a poison message
            return None
        if event.source not in self.sources or not self.processor.runs(event):  # a route it does not know too
            self._track(self._unknown_source(message, event), event)
            return None
        if event.source in self.paused:
            self._track(self._park(message, event), event)
            return None
        if not event.route and self.sources[event.source].routes:
            self._track(self._fan_out(message, event), event)
            return None
        return event

    async def _fan_out(self, message: AbstractIncomingMessage, event: EventMessage) -> None:
        """An event of a source with routes: one confirmed message per route
        that takes it, then the ack (workers/fan_out.py)."""
        started = time.perf_counter()
        try:
            routed = route_messages(self.sources[event.source], event)
            namespace = self.settings.namespace
            await asyncio.gather(
                *(
                    self._until_done(
                        lambda e: self.failures.publish_to(e, topology.events_queue_for(namespace, e.key)), one
                    )
                    for one in routed
                )
            )
        except Exception:  # a bug: never pin the message (a second fan-out only makes copies)
            log.exception("fan_out_crashed")
            await self._send_back_counted(message, event)
            return
        await self._deliveries.ack(message)
        if not routed:  # the ingress answers such an event `ignored`: a sources file changed between them
            log.warning("event_unrouted", source=event.source, key=event.key)
        self._settled(event, Outcome.ROUTED if routed else Outcome.UNROUTED, started)

    async def _park(self, message: AbstractIncomingMessage, event: EventMessage) -> None:
        """A paused source's event: kept on its parking queue, not run (workers/pauses.py)."""
        started = time.perf_counter()
        await self._until_done(self.parking.park, event)
        await self._deliveries.ack(message)
        self._settled(event, Outcome.PARKED, started)

    async def _unknown_source(self, message: AbstractIncomingMessage, event: EventMessage) -> None:
        """Sources files out of step (a rolling deploy): the event waits in a
        delay queue for a worker that knows its source (a route's message: its
        route, shared/sources/routes.py) — no requeue loop, no
        delivery spent. Past `UNKNOWN_SOURCE_PATIENCE` it is a dead letter
        on-call sees (and replays once the sources file is fixed), counted
        from the first time a worker did not know the source — not from the
        event's arrival, which may be long ago (an outbox, a backlog)."""
        started = time.perf_counter()
        now_ms = round(time.time() * 1000)
        since_ms = event.unknown_source_since_ms or now_ms
        waited = (now_ms - since_ms) / 1000
        if waited < UNKNOWN_SOURCE_PATIENCE:
            log.warning(
                "unknown_source_waiting",
                source=event.source,
                key=event.key,
                retry_in=UNKNOWN_SOURCE_RETRY,
                **({"route": event.route} if event.route else {}),
            )
            waiting = replace(event, unknown_source_since_ms=since_ms)
            await self._until_done(lambda e: self.failures.delay(e, UNKNOWN_SOURCE_RETRY), waiting)
            outcome = Outcome.DEFERRED
        else:
            error = unknown_source_error(event, waited)
            await self._until_done(lambda e: self.failures.dead_letter(e, error), event)
            outcome = Outcome.DEAD
        await self._deliveries.ack(message)
        self._settled(event, outcome, started)

    async def _handle(self, message: AbstractIncomingMessage, event: EventMessage) -> None:
        started = time.perf_counter()
        with structlog.contextvars.bound_contextvars(source=event.source, key=event.key, attempt=event.attempt):
            try:
                outcome = None
                if message.redelivered:
                    outcome = await self._until_done(self._settled_before, event)
                if outcome is None:
                    outcome = await self._until_done(self.processor.process, event)
            except Exception:  # a bug, not the handler (that is a retry): never pin the message
                log.exception("processing_crashed")
                await self._send_back_counted(message, event)
                self._copies.settle(event, None)
                return
            await self._deliveries.ack(message)
        self._copies.settle(event, outcome)
        self._settled(event, outcome, started)

    async def _settled_before(self, event: EventMessage) -> Outcome | None:
        """A redelivery (its worker died before the ack) whose earlier
        delivery completed the event or recorded its dead letter: counted
        now as what it was, since the dead process never counted it."""
        settled = await self.completions.settled_before(event)
        if settled.completed:
            return Outcome.PROCESSED
        return Outcome.DEAD if settled.dead else None

    async def _follow(self, leader, message: AbstractIncomingMessage, event: EventMessage) -> None:
        """A copy of an event this process is working on (`workers.claim.copies`)."""
        started = time.perf_counter()
        if await self._copies.completed_for(leader, event):
            await self._deliveries.ack(message)
            self._settled(event, Outcome.DUPLICATE, started)
        elif not self._stopping.is_set():  # else left unacked: the broker redelivers it
            self._dispatch(message, event)

    def _start_batches(self) -> None:
        # Group commit: while batches are running, deliveries wait in
        # `_pending`; each batch that ends takes all of them. Batches grow
        # with the load and a lone event never waits for company.
        if self._stopping.is_set():
            return  # left unacked: the broker redelivers them
        while self._pending and self._running_batches < PARALLEL_BATCHES:
            batch, self._pending = self._pending, []
            self._running_batches += 1
            self._track(self._handle_batch(batch))

    async def _handle_batch(self, batch: list[tuple[AbstractIncomingMessage, EventMessage]]) -> None:
        started = time.perf_counter()
        try:
            outcomes = await self._until_done(self.batch_processor.process, [event for _, event in batch])
        except Exception:
            log.exception("batch_crashed", size=len(batch))
            outcomes = None
        finally:
            self._running_batches -= 1
            self._start_batches()
        if outcomes is None:  # one by one, so only the culprit goes back to the queue
            await asyncio.gather(*(tracing.within(event, self._handle(message, event)) for message, event in batch))
            return
        await self._deliveries.ack_batch([message for message, _ in batch])
        for (_, event), outcome in zip(batch, outcomes):
            self._copies.settle(event, outcome)
            with tracing.continued(event):  # its log line, with its trace id
                self._settled(event, outcome, started)

    def _settled(self, event: EventMessage, outcome: Outcome, started: float) -> None:
        """A message settled (acked): its metrics and log line, and what the archive keeps of it."""
        _observe(event, outcome, started)
        self.archive.settled(event, outcome)

    async def _until_done(self, process, work):
        """Runs `process(work)`; an outage pauses and runs it again, using no attempt."""
        while True:
            try:
                return await process(work)
            except Exception as exc:
                kind = outage_kind(exc)
                if kind is None:
                    raise
                await self._gates[kind].wait(exc)

    async def _send_back_counted(self, message: AbstractIncomingMessage, event: EventMessage) -> None:
        """A crash in our own code: the event comes back after a short delay
        with one more delivery counted, so one that always crashes us ends in
        the dead letters. Counted by us, not by the queue: RabbitMQ 4.3 and
        later no longer count a requeue toward the delivery limit."""
        counted = replace(event, deliveries=event.deliveries + 1)
        try:
            if counted.deliveries > self.settings.delivery_limit:
                await self._deliveries.reject(message)  # NS.dead: the drainer records it
                return
            await self.failures.delay(counted, DEFER_SECONDS)
            await self._deliveries.ack(message)
        except Exception as exc:  # noqa: BLE001 - the broker is away: it redelivers anyway
            log.warning("send_back_failed", error=describe(exc))

    async def _probe_postgres(self) -> None:
        await self.completions.probe_writable()

    async def _probe_broker(self) -> None:
        if not self.connection.connected.is_set():
            raise ConnectionError("broker not connected")


async def _close_forward_session() -> None:
    """The `forward` handler's HTTP session, if a source's handler loaded it:
    not imported here, so a worker without it starts without aiohttp."""
    forward = sys.modules.get("webhook_ingest.workers.handlers.forward")
    if forward is not None:
        await forward.close_session()


def _observe(event: EventMessage, outcome: Outcome, started: float) -> None:
    """The settled message's metrics and its one log line (follow a key through the logs)."""
    elapsed = time.perf_counter() - started
    if outcome.value in _COUNTED_OUTCOMES:
        metrics.events.labels(event.source, outcome.value).inc()
    metrics.processing_duration.labels(event.source).observe(elapsed)
    log.info(
        "event_processed",
        source=event.source,
        key=event.key,
        attempt=event.attempt,
        outcome=outcome.value,
        duration_ms=round(elapsed * 1000, 1),
    )


def unknown_source_error(event: EventMessage, waited: float) -> dict:
    what = f"route {event.route!r} of source {event.source!r}" if event.route else f"source {event.source!r}"
    return {
        "attempt": event.attempt,
        "at": datetime.now(UTC).isoformat(),
        "type": "UnknownSource",
        "message": f"no worker knew {what} for {waited:.0f} s (add it to the workers' sources file, then replay)",
    }


_COUNTED_OUTCOMES = {
    o.value
    for o in (Outcome.PROCESSED, Outcome.STALE, Outcome.DUPLICATE, Outcome.CONFLICT, Outcome.RETRIED, Outcome.DEAD)
}


async def _server_keepalives(connection: asyncpg.Connection) -> None:
    """The server ends a session whose worker a partition cut off within
    about 25 s, not the system's two hours: until then its transaction keeps
    the key's turn from every other worker (docs/design.md, "Exclusion").
    SET, not startup parameters, which a PgBouncer in front refuses."""
    await connection.execute(SERVER_KEEPALIVES)


async def _keep_session(connection: asyncpg.Connection) -> None:
    """Pool release without asyncpg's reset query (a round trip per release).

    Every use of a pooled connection here is a transaction we open and close
    (asyncpg still rolls back one left open); handlers must keep session
    state transaction-local (`SET LOCAL`, `pg_advisory_xact_lock`).
    """


async def _wait_for(service: str, connect):
    """Connect, retrying while the service is down: work waits, it does not fail."""
    pauses = backoff.pauses()
    while True:
        try:
            return await connect()
        except (OSError, asyncio.TimeoutError, asyncpg.PostgresError, aio_pika.exceptions.AMQPError) as exc:
            pause = next(pauses)
            log.warning("service_unreachable", service=service, error=describe(exc), retry_in=pause)
            await asyncio.sleep(pause)


def install_signal_handlers(worker: Worker) -> None:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, worker.stop)
