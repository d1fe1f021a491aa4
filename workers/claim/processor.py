"""One message, one pass through the idempotency state machine.

1. Claim the key in Redis (`SET NX` on a majority of masters = the Redlock
   processing lock), kept alive from that moment until the pass ends, so
   no wait that follows (for a pooled connection, say) eats its validity.
   A key Redis knows completed is a duplicate (or a conflict, when the
   payload hash differs) and is acked at once. A key held elsewhere is
   claimed again a few times (its holder is usually done within
   milliseconds), then goes on to Postgres without the Redis lock: the
   holder may be dead, and Postgres decides. No Redis quorum is degraded
   mode, which goes on to Postgres the same way.
2. Take the key's lease in Postgres (one autocommit statement, which also
   registers a new fencing token; a key leased elsewhere is deferred), then
   read whether the key is completed, in the next statement, so a holder's
   completion committed meanwhile is seen. Run the handler, cancelled if
   the lease is lost meanwhile. `ctx.db` is a transaction opened at the
   handler's first query (`workers.claim.handler_db`), which takes the key's turn
   (an advisory lock) first; a handler that never queries holds no
   connection while it waits on the network. An ordered row's opens as its
   handler starts instead, beside the handler's work, when that handler's
   last ordered run queried soon (OPEN_EARLY_SECONDS). Insert the completion row —
   refused unless our token is current — in that transaction, or in a
   statement of its own; it ends the lease in the same commit.
3. Tell Redis the key is done (best effort), which also frees the lock.

Why the lease and the turn, and what the lock and the token are for:
docs/design.md, "Exclusion". A handler failure rolls the transaction back, frees the lock
and becomes a retry or a dead letter (`workers.claim.retry`). Outages of Postgres
or RabbitMQ are not failures: their exceptions leave this module, and the
worker waits for the service and runs the message again, no attempt used.
"""

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any, assert_never

import asyncpg

from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.event import EventMessage
from webhook_ingest.shared.observability import get_logger, tracing
from webhook_ingest.shared.sources import Source
from webhook_ingest.workers.failures import found_in_chain, outage_kind
from webhook_ingest.workers.handlers import (
    Event,
    HandlerContext,
    batch_form,
    handler_key,
    load_handlers,
    replay_of,
)

from .archive_notes import NO_NOTES, ArchiveNotes
from .attempts import already_handed_on
from .coalesced import CoalescedStatements
from .handler_db import HandlerTransaction
from .idempotency import Claim, quietly
from .in_flight import KeysInFlight
from .lease import Keeper, Lease, LockLost, cancelled_when_lost, kept_alive
from .ports import CompletionStorePort, FailurePolicyPort, IdempotencyStorePort
from .redlock import Lock
from .renewals import LeaseRenewals, LockRenewals
from .states import ClaimState, Outcome, classify_completed

READ_ONLY = asyncpg.ReadOnlySQLTransactionError
log = get_logger(__name__)
DEFER_SECONDS = 1.0
BUSY_RECHECKS = (0.01, 0.02, 0.04, 0.08, 0.16, 0.24)  # seconds, ~0.55 in all
TURN_RECHECKS = (0.02, 0.05, 0.1, 0.2)  # seconds: a turn held in Postgres, before deferring
# An ordered row's `ctx.db` opens as its handler starts, beside the handler's own work, when that
# handler's last ordered run queried within this of starting: a hot key's rows wait on each run's
# latency, and a connection held this long the more is cheap (docs/design.md, "Ordering keys").
OPEN_EARLY_SECONDS = 0.02
# Outcomes whose pass always wrote the key's done marker over our lock. Not
# DUPLICATE: a copy of an attempt handed on, or a dead letter that found the
# key completed meanwhile, writes none, so a DUPLICATE's lock is released —
# compare-and-delete, a no-op where a marker replaced it.
_RELEASED_BY_DONE_MARKER = (Outcome.PROCESSED, Outcome.CONFLICT)


def _stale(message: EventMessage) -> bool:
    """An ordered row older (`by`) than its lane's last processed, under `stale = "skip"`."""
    return message.ordered is not None and message.ordered.stale


class CompletionRefused(Exception):
    """Our fencing token is not the key's current one, or the key completed meanwhile."""


class HandlerFailed(Exception):
    """The handler raised; the original exception is the cause."""


class AlreadyCompleted(Exception):
    def __init__(self, completed_sha256: str):
        self.completed_sha256 = completed_sha256


class TurnTaken(Exception):
    """Another run holds the key's turn in Postgres."""


class AttemptHandedOn(Exception):
    """This message's attempt already ran and was handed on: it is a copy (`workers.claim.attempts`)."""


class Processor:
    def __init__(
        self,
        sources: dict[str, Source],
        store: IdempotencyStorePort,
        completions: CompletionStorePort[Any],
        failures: FailurePolicyPort,
        archive: ArchiveNotes = NO_NOTES,
        renewal_writers: int = 2,
        open_early: int = 1,
    ):
        self._sources = sources
        self._handlers = load_handlers(sources)
        self._store = store
        self._completions = completions
        self._failures = failures
        self._archive = archive
        self._lock_renewals = LockRenewals(store)
        self._lease_renewals = LeaseRenewals(completions, store.redlock.ttl_ms, renewal_writers)
        self._statements = CoalescedStatements(completions, store.redlock.ttl_ms)
        self._background: set[asyncio.Task] = set()  # ordered rows' done markers
        self.in_flight = KeysInFlight()  # a copy of a key run here waits for that run, not for Postgres
        # per handler, seconds from its last ordered run's start to its first ctx.db query (inf: none)
        self._first_query_after: dict[str, float] = {}
        # ordered rows' transactions opened early at most at once: each holds a session through its
        # handler's work before its first query, which the others' lazy openings may be waiting for
        self._open_early = open_early
        self._opened_early = 0

    def runs(self, message: EventMessage) -> bool:
        """Whether a handler here runs `message`: its source's, or its route's
        (a route message for a route this worker's sources file lacks does not)."""
        return handler_key(message.source, message.route) in self._handlers or (
            not message.route and bool(self._sources[message.source].routes)
        )  # an event to fan out

    def batchable(self, message: EventMessage) -> bool:
        """Whether the source's handler may share a transaction (`workers.claim.batch`)."""
        return getattr(self._handlers[handler_key(message.source, message.route)], "batchable", False)

    async def process(self, message: EventMessage) -> Outcome:
        with tracing.span("claim", message):
            claim = await self._store.claim(message.key)
        return await self.process_claimed(message, claim)

    async def process_claimed(self, message: EventMessage, claim: Claim) -> Outcome:
        match claim.state:
            case ClaimState.COMPLETED:
                assert claim.completed_sha256 is not None  # a done marker holds the hash
                return await self.completed(message, claim.completed_sha256, redis_knows=True)
            case ClaimState.BUSY:
                claim = await self._claim_when_free(message.key)
                if claim.state is ClaimState.BUSY:  # its holder may be dead: Postgres decides
                    return await self._run(message)
                return await self.process_claimed(message, claim)
            case ClaimState.ACQUIRED:
                assert claim.lock is not None
                return await self.run_locked(message, claim.lock)
            case ClaimState.UNAVAILABLE:
                return await self._run(message)
            case _:
                assert_never(claim.state)

    async def run_ordered(self, message: EventMessage) -> Outcome:
        """A row of an ordering key's lane (`message.ordered`), run by the
        lane's holder: no Redis claim (the lane's lease keeps other workers off
        its rows; a copy elsewhere still meets the key's lease, turn and
        fence), then `_run`, whose completion advances the lane
        (docs/design.md, "Ordering keys")."""
        assert message.ordered is not None
        return await self._run(message)

    async def run_leased(self, message: EventMessage, lease: Lease, completed_sha256: str | None) -> Outcome:
        """`run_ordered` for a row whose lease its page took (`lease_rows`)."""
        assert message.ordered is not None
        return await self._run(message, lease, completed_sha256)

    async def lease_rows(self, keys: list[str]) -> tuple[dict[str, Lease], dict[str, str]]:
        """The leases granted among `keys` (distinct) in one statement, and
        which of those keys are completed, read in the next statement (its
        snapshot follows the grants: "Exclusion")."""
        async with self._completions.statement() as connection:
            leases = await self._completions.take_leases(connection, keys, self._store.redlock.ttl_ms)
            completed = await self._completions.check_completed(connection, list(leases)) if leases else {}
        return leases, completed

    async def release_leases(self, leases: list[Lease]) -> None:
        await self._completions.release_leases(leases)

    async def _claim_when_free(self, key: str) -> Claim:
        """Claims again a few times while the key is in flight elsewhere.

        Copies of one event arrive together; the first is usually done within
        milliseconds, and a re-claim (one SET NX) then finds it completed —
        much cheaper than a round through Postgres or the retry queue.
        """
        for pause in BUSY_RECHECKS:
            await asyncio.sleep(pause)
            claim = await self._store.claim(key)
            if claim.state is not ClaimState.BUSY:
                return claim
        return claim

    async def run_locked(self, message: EventMessage, lock: Lock, keeper: Keeper | None = None) -> Outcome:
        """`_run` under our Redis lock, kept alive meanwhile (by the caller,
        when it passes its `keeper`) so that other workers stay off the key
        without a round through Postgres; the lock ends replaced by a done
        marker or released, whatever the outcome. A lock that could not be
        kept does not stop the run: the lease decides (`_complete`)."""
        outcome = None
        try:
            if keeper is not None:
                outcome = await self._run(message)
            else:
                async with kept_alive([self.redis_keeper(lock)]):
                    outcome = await self._run(message)
        finally:
            if outcome not in _RELEASED_BY_DONE_MARKER:
                await quietly(self._store.release(lock))
        return outcome

    async def _run(
        self, message: EventMessage, leased: Lease | None = None, completed_sha256: str | None = None
    ) -> Outcome:
        """`_run_alone`, once no other run of the key in this process is
        (`workers.claim.in_flight`: a stall must not hand a run's lapsed
        lease to its own copy)."""
        async with self.in_flight.running(message.key):
            return await self._run_alone(message, leased, completed_sha256)

    async def _run_alone(
        self, message: EventMessage, leased: Lease | None = None, completed_sha256: str | None = None
    ) -> Outcome:
        """Step 2 and 3, under a Redis lock already kept alive (or none).
        What follows a failure (dead letter, conflict row, deferral) runs
        with no connection held, so a full pool never waits on itself. The
        lease is kept until a failed attempt is handed on (`workers.claim.attempts`).
        `leased`: the key's lease taken already (an ordered page's, `lease_rows`),
        with the completion check its statement read after the grant."""
        lease = leased
        try:
            async with contextlib.AsyncExitStack() as keeping:
                try:
                    with tracing.span("lease", message):
                        if lease is None:
                            lease = await self._take_lease(message.key)
                        if already_handed_on(message, lease.handed_on):
                            raise AttemptHandedOn()
                        lease_keeper = self.lease_keeper([lease])
                        await keeping.enter_async_context(kept_alive([lease_keeper]))
                        if leased is None:
                            await self._check_not_completed(message.key)
                        elif completed_sha256 is not None:
                            raise AlreadyCompleted(completed_sha256)
                    await self._complete(message, lease, lease_keeper)
                    lease = None  # ended by the completion
                except Exception as exc:
                    outcome = await self._settle_unfinished(message, exc)
                    if outcome is None:
                        raise  # an outage (the worker waits for the service) or a bug
                    return outcome
        finally:
            if lease is not None:
                await self._completions.release_leases([lease])
        if message.ordered is None:
            await quietly(self._store.complete(message.key, message.payload_sha256))
        else:  # the lane's next row need not wait for Redis (a hint only: the lane lease keeps others off)
            self._in_background(quietly(self._store.complete(message.key, message.payload_sha256)))
        return Outcome.STALE if _stale(message) else Outcome.PROCESSED

    def _in_background(self, coroutine) -> None:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _complete(self, message: EventMessage, lease: Lease, lease_keeper: Keeper) -> None:
        """The handler (cancelled if the lease is lost meanwhile) and the
        completion row, in the handler's transaction if it opened one. The
        lease alone decides: the Redis lock is a hint that keeps others off
        cheaply, and a run whose lease held is not undone for a lock Redis
        forgot (docs/design.md, "A lock that cannot be kept")."""
        handler_db = HandlerTransaction(self._completions, message.key, self._statements.complete_alone)
        with contextlib.ExitStack() as committing:  # the commit's span ends after the transaction's COMMIT
            async with handler_db:
                with cancelled_when_lost(lease_keeper, handler_db):  # inside: a lost lease closes, never rolls back
                    if message.ordered is not None:
                        if not _stale(message):  # a stale ordered row completes unrun
                            await self._call_ordered(handler_db, message)
                    else:
                        await self.call_handler(handler_db, message)
                    lease_keeper.check()
                    committing.enter_context(tracing.span("commit", message))
                    if not await handler_db.complete(message, lease.token):
                        raise CompletionRefused()

    async def _call_ordered(self, handler_db: HandlerTransaction, message: EventMessage) -> None:
        """`call_handler` for an ordered row: its `ctx.db` opened early when
        its handler queried soon after starting last time (OPEN_EARLY_SECONDS),
        and fewer than `open_early` rows' are (a hot key is one at a time;
        many lanes of such a handler would hold the pool through their work)."""
        handler = handler_key(message.source, message.route)
        started = time.monotonic()
        early = self._first_query_after.get(handler, math.inf) <= OPEN_EARLY_SECONDS
        early = early and self._opened_early < self._open_early
        if early:
            self._opened_early += 1
            handler_db.open_early()
        try:
            await self.call_handler(handler_db, message)
        finally:
            if early:
                self._opened_early -= 1
        first = handler_db.first_query_at
        self._first_query_after[handler] = math.inf if first is None else first - started

    async def _settle_unfinished(self, message: EventMessage, exc: Exception) -> Outcome | None:
        """What a pass that did not complete becomes; None for an outage or a bug."""
        match found_in_chain(
            exc, (AttemptHandedOn, AlreadyCompleted, CompletionRefused, TurnTaken, LockLost, HandlerFailed)
        ):
            case AttemptHandedOn():
                log.info("attempt_already_handed_on", replay_of=message.replay_of)
                return Outcome.DUPLICATE
            case AlreadyCompleted() as done:
                return await self.completed(message, done.completed_sha256)
            case CompletionRefused():
                return await self._refused(message)
            case TurnTaken() | LockLost() as busy:
                return await self.defer(message, reason=type(busy).__name__)
            case HandlerFailed() as failed:
                assert failed.__cause__ is not None
                outcome = await self._failures.fail(message, self._sources[message.source], failed.__cause__)
                self._archive.failed(message, outcome, failed.__cause__)
                if outcome in (Outcome.RETRIED, Outcome.DEAD):  # not: completed meanwhile, or not ours to settle
                    await self._completions.record_handed_on(message)
                return outcome
        return None

    async def _take_lease(self, key: str) -> Lease:
        """The key's lease; a few short waits while another run holds it,
        with no connection held meanwhile."""
        for pause in (*TURN_RECHECKS, None):
            lease = await self._statements.take_lease(key)
            if lease is not None:
                return lease
            if pause is None:
                raise TurnTaken()
            await asyncio.sleep(pause)
        raise AssertionError("unreachable")

    async def _check_not_completed(self, key: str) -> None:
        completed_sha256 = await self._statements.completed_sha256(key)
        if completed_sha256 is not None:
            raise AlreadyCompleted(completed_sha256)

    def redis_keeper(self, lock: Lock) -> Keeper:
        async def renew() -> bool:
            return await self._lock_renewals.extend(lock)

        return Keeper("redis", renew, self._store.redlock.ttl_ms / 1000, lock.valid_until, refusal_is_final=False)

    def lease_keeper(self, leases: list[Lease]) -> Keeper:
        ttl_ms = self._store.redlock.ttl_ms

        async def renew() -> bool:
            return await self._lease_renewals.extend(leases)

        # valid from before it was taken: the server's clock starts later than that
        taken_at = min(lease.sent_at for lease in leases)
        return Keeper("postgres", renew, ttl_ms / 1000, taken_at + ttl_ms / 1000)

    async def call_handler(self, db: HandlerTransaction | asyncpg.Connection, message: EventMessage) -> None:
        """Runs the source's handler with `db` as `ctx.db`; raises HandlerFailed
        for the handler's own failures, TurnTaken when its `ctx.db` found the
        key's turn held elsewhere, and an outage as itself."""
        handler = self._handlers[handler_key(message.source, message.route)]
        call = partial(handler, _event(message), self._context(db, message))
        await self._called(db, tracing.span("handler", message, failed_by_errors=True), call)

    async def call_handlers(self, db: asyncpg.Connection, messages: list[EventMessage]) -> None:
        """call_handler for each of `messages` (a batch's, in one transaction),
        in order; the messages of a handler with a batch form (`handle.batch`,
        docs/reference.md §7) in one call of it, with their handler's first
        message's place. A failure of either raises as call_handler's does."""
        runs: dict[str, list[EventMessage]] = {}
        for message in messages:
            runs.setdefault(handler_key(message.source, message.route), []).append(message)
        for key, run in runs.items():
            batch = batch_form(self._handlers[key])
            if batch is None or len(run) == 1:
                for message in run:
                    await self.call_handler(db, message)
                continue
            call = partial(batch, [_event(message) for message in run], self._context(db, run[0]))
            try:
                await self._called(db, tracing.spans("handler", run), call)
            except HandlerFailed as failed:  # each alone next, and most succeed: say it once here
                cause = failed.__cause__ or failed
                log.warning("batch_form_failed", handler=key, events=len(run), error=describe(cause))
                raise

    def _context(self, db: HandlerTransaction | asyncpg.Connection, message: EventMessage) -> HandlerContext:
        options = self._sources[message.source].handler_for(message.route)[1]
        return HandlerContext(db=db, options=options, logger=log)

    async def _called(
        self,
        db: HandlerTransaction | asyncpg.Connection,
        span: contextlib.AbstractContextManager,
        call: Callable[[], Awaitable[Any]],
    ) -> None:
        """Calls the handler (`call`) and awaits it within `span`, its exceptions
        told apart (call_handler): a call that raises at once (a handler that
        forgot `ctx`) is the handler's failure too."""
        try:
            with span:
                await call()
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # we are cancelled: a lost lease (lease.cancelled_when_lost) or a shutdown
            # the handler's own: it awaited a future another task cancelled — a failure like any other
            raise HandlerFailed() from exc
        except Exception as exc:
            if getattr(db, "queries_refused", False):
                raise TurnTaken() from exc  # whatever the handler made of TurnRefused
            opening = getattr(db, "open_error", None)
            if opening is not None and outage_kind(opening) is not None:
                raise opening from exc  # opening ctx.db's transaction is ours, as its connect errors are
            if isinstance(exc, READ_ONLY):  # a session opened before a failover: the next run gets a new one
                await self._completions.expire_sessions()
                raise
            if outage_kind(exc, in_handler=True) and db.is_closed():
                raise  # ctx.db lost its connection: Postgres is away, not the handler's fault
            raise HandlerFailed() from exc
        if getattr(db, "queries_refused", False):
            raise TurnTaken()  # the handler swallowed TurnRefused: it must not complete

    async def completed(self, message: EventMessage, completed_sha256: str, redis_knows: bool = False) -> Outcome:
        """A key found completed: a duplicate, or a conflict (the first payload stays)."""
        outcome = classify_completed(completed_sha256, message.payload_sha256)
        if outcome is Outcome.CONFLICT:
            log.warning(
                "payload_conflict", completed_sha256=completed_sha256, conflicting_sha256=message.payload_sha256
            )
            await self._completions.record_conflict(message, completed_sha256)
        if not redis_knows:  # Redis forgot (flushed, expired), or holds our lock: the marker replaces it
            await quietly(self._store.complete(message.key, completed_sha256))
        return outcome

    async def _refused(self, message: EventMessage) -> Outcome:
        completed_sha256 = await self._completions.completed_sha256(message.key)
        if completed_sha256 is not None:
            return await self.completed(message, completed_sha256)
        # Not completed, and our token is not the key's: never read that as
        # "done" — the event comes back and runs again.
        log.warning("completion_refused_stale_token")
        return await self.defer(message, reason="CompletionRefused")

    async def defer(self, message: EventMessage, reason: str) -> Outcome:
        """Sends the event back to the queue after a short delay; no attempt used."""
        log.info("event_deferred", reason=reason, retry_in=DEFER_SECONDS)
        await self._failures.delay(message, DEFER_SECONDS)
        return Outcome.DEFERRED


def _event(message: EventMessage) -> Event:
    """What the handler is given of `message`."""
    return Event(
        source=message.source,
        event_id=message.event_id,
        key=message.key,
        headers=dict(message.headers),  # the handler's own: the message's stay as sent, for a run again
        received_at=datetime.fromtimestamp(message.received_at, UTC),
        attempt=message.attempt,
        body=message.body,
        route=message.route,
        replay=replay_of(message.key, message.replay_of),
    )
