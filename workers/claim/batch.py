"""Many events, few round trips: the state machine of `workers.claim.processor`
run for a batch of messages at once.

On two cores the worker's cost is round trips — each Redis or Postgres call
is ~50–100 µs of Python on our side and as much again on the server's — so
the steps that do not depend on one another are done for the whole batch:

1. one pipelined `SET NX` per Redis master claims every key;
2. one statement takes every acquired key's lease (and fencing token);
3. one transaction takes the leased keys' turns in one statement, reads
   which are completed in another, runs the handlers, each handler's events
   in key order and the handlers in the order of their first event (a
   handler's batch form, `handle.batch`, once for all its events), then
   inserts every completion row in one statement (each still refused
   unless its token is current), and commits;
4. one pipeline per master writes the done markers.

Only handlers marked `batchable` (effects through `ctx.db` alone, like
`inbox`) take this path: they run one after the other in the shared
transaction. If any handler fails or any completion is refused, the
transaction rolls back — no effect of the batch survives — and each of its
events goes through `Processor` alone, keeping the lock it holds. Keys that
are not freshly acquired (duplicates, keys in flight elsewhere, degraded
mode) go through `Processor` alone from the start; keys another run of this
process holds (`workers.claim.in_flight`) go alone after the commit, where
they wait for that run.

Ordering keys' lanes (workers/ordering/) bring their due head rows
(`run_heads`): steps 2 and 3 for many lanes at once, without the Redis
claim (a lane's lease keeps other workers off its rows), each completion
advancing its lane only while the lane's token is its holder's.
"""

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

import asyncpg

from webhook_ingest.shared.event import EventMessage
from webhook_ingest.shared.observability import tracing
from webhook_ingest.workers.failures import found_in_chain

from .attempts import already_handed_on
from .completions import LOCK_CONFLICTS
from .idempotency import quietly
from .lease import Keeper, Lease, LockLost, cancelled_when_lost, kept_alive
from .ports import CompletionStorePort, IdempotencyStorePort
from .processor import HandlerFailed, Processor
from .redlock import Lock
from .states import ClaimState, Outcome


class _RollBack(Exception):
    """Something in the batch cannot complete: undo all of it."""


class BatchProcessor:
    def __init__(self, processor: Processor, store: IdempotencyStorePort, completions: CompletionStorePort[Any]):
        self._processor = processor
        self._store = store
        self._completions = completions

    async def process(self, messages: list[EventMessage]) -> list[Outcome]:
        """Outcomes in the order of `messages`; copies of a key wait for its first."""
        leaders, copies = _split_copies(messages)
        outcomes = dict(zip(leaders, await self._process_distinct([messages[i] for i in leaders])))
        for i, leader in copies.items():
            if (
                outcomes[leader] in (Outcome.PROCESSED, Outcome.DUPLICATE)
                and messages[i].payload_sha256 == messages[leader].payload_sha256
            ):
                outcomes[i] = Outcome.DUPLICATE  # the same event, completed a moment ago
        rest = [i for i in copies if i not in outcomes]  # conflicts, or a leader that failed
        outcomes.update(
            zip(rest, await _all(*(tracing.within(messages[i], self._processor.process(messages[i])) for i in rest)))
        )
        return [outcomes[i] for i in range(len(messages))]

    async def _process_distinct(self, messages: list[EventMessage]) -> list[Outcome]:
        with tracing.spans("claim", messages):
            claims = await self._store.claim_many([message.key for message in messages])
        acquired = {
            i: claim.lock
            for i, claim in enumerate(claims)
            if claim.state is ClaimState.ACQUIRED and claim.lock is not None
        }  # an acquired claim holds its lock
        # kept alive from the claim on: a wait for a pooled connection must not eat them
        keepers = {i: self._processor.redis_keeper(lock) for i, lock in acquired.items()}
        outcomes: dict[int, Outcome] = {}
        alone = [i for i in range(len(messages)) if i not in acquired]
        try:
            async with kept_alive(list(keepers.values())):
                batched, *one_by_one = await _all(
                    self._run_acquired(messages, acquired, keepers),
                    *(
                        tracing.within(messages[i], self._processor.process_claimed(messages[i], claims[i]))
                        for i in alone
                    ),
                )
        except BaseException:
            await quietly(asyncio.gather(*(self._store.release(lock) for lock in acquired.values())))
            raise
        outcomes.update(batched)
        outcomes.update(zip(alone, one_by_one))
        return [outcomes[i] for i in range(len(messages))]

    async def run_heads(self, heads: Sequence[tuple[EventMessage, Lease | None]]) -> list[Outcome | None]:
        """Lanes' head rows (`message.ordered`) in one transaction, each as
        `Processor.run_ordered` would run it; a head may bring its lease (its
        page's, checked not completed). None: not run here — its key leased
        elsewhere or twice in the batch, or the batch rolled back — it goes
        through `Processor` alone, with the lease it brought; the leases
        taken here are given back. An outage raises, every lease given back."""
        messages = [message for message, _ in heads]
        first = {message.key: i for i, message in reversed(list(enumerate(messages)))}
        distinct = sorted(first.values(), key=lambda i: messages[i].key)
        asked = [i for i in distinct if heads[i][1] is None]
        held = {i: lease for i in distinct if (lease := heads[i][1]) is not None}
        outcomes: dict[int, Outcome] = {}
        completed_now: set[str] = set()
        try:
            if asked:
                async with self._completions.statement() as connection:
                    with tracing.spans("lease", [messages[i] for i in asked]):
                        taken = await self._completions.take_leases(
                            connection, _keys(messages, asked), self._store.redlock.ttl_ms
                        )
                held |= {i: taken[messages[i].key] for i in asked if messages[i].key in taken}
            outcomes |= {
                i: Outcome.DUPLICATE for i, lease in held.items() if already_handed_on(messages[i], lease.handed_on)
            }
            leased = [i for i in distinct if i in held and i not in outcomes]
            passed = await self._commit_heads(messages, leased, held) if leased else None
            if passed is not None:
                fresh, completed, _ = passed  # the busy: alone
                completed_now = {messages[i].key for i in fresh}
                outcomes |= {i: Outcome.STALE if _stale(messages[i]) else Outcome.PROCESSED for i in fresh}
                for i, completed_sha256 in completed.items():
                    outcomes[i] = await self._processor.completed(messages[i], completed_sha256)
        except BaseException:
            await self._completions.release_leases([lease for lease in held.values() if lease.key not in completed_now])
            raise
        given_back = [lease for i, lease in held.items() if heads[i][1] is None or i in outcomes]
        await self._completions.release_leases([lease for lease in given_back if lease.key not in completed_now])
        await quietly(
            self._store.complete_many(
                [(messages[i].key, messages[i].payload_sha256) for i in outcomes if messages[i].key in completed_now]
            )
        )
        return [outcomes.get(i) for i in range(len(heads))]

    async def _commit_heads(
        self, messages: list[EventMessage], leased: list[int], held: dict[int, Lease]
    ) -> tuple | None:
        leases = {messages[i].key: held[i] for i in leased}
        lease_keeper = self._processor.lease_keeper(list(leases.values()))
        async with kept_alive([lease_keeper]), self._completions.session() as connection:
            return await self._commit(connection, messages, leased, leases, lease_keeper)

    async def _run_acquired(
        self, messages: list[EventMessage], locks: dict[int, Lock], lock_keepers: dict[int, Keeper]
    ) -> dict[int, Outcome]:
        if not locks:
            return {}
        order = sorted(locks, key=lambda i: messages[i].key)
        passed = None
        # a key another run here holds is not asked for (`workers.claim.in_flight`): it goes alone below
        with self._processor.in_flight.running_free(_keys(messages, order)) as free:
            if free:
                ours = set(free)
                passed = await self._lease_and_commit(messages, [i for i in order if messages[i].key in ours])
        if passed is None:  # rolled back, or nothing leased: each on its own, still under its lock
            settled = await _all(
                *(
                    tracing.within(messages[i], self._processor.run_locked(messages[i], locks[i], lock_keepers[i]))
                    for i in order
                )
            )
            return dict(zip(order, settled))
        fresh, completed, busy, handed_on = passed
        busy += [i for i in order if messages[i].key not in ours]
        outcomes = {i: Outcome.PROCESSED for i in fresh}
        outcomes.update({i: Outcome.DUPLICATE for i in handed_on})  # copies of an attempt already run
        for i in [*fresh, *handed_on, *completed]:
            lock_keepers[i].retire()  # released or replaced by a done marker below
        await quietly(asyncio.gather(*(self._store.release(locks[i]) for i in handed_on)))
        await quietly(self._store.complete_many([(messages[i].key, messages[i].payload_sha256) for i in fresh]))
        for i, completed_sha256 in completed.items():  # Postgres knew, Redis forgot
            outcomes[i] = await tracing.within(messages[i], self._processor.completed(messages[i], completed_sha256))
        settled = await _all(
            *(
                tracing.within(messages[i], self._processor.run_locked(messages[i], locks[i], lock_keepers[i]))
                for i in busy
            )
        )
        outcomes.update(zip(busy, settled))
        return outcomes

    async def _lease_and_commit(self, messages: list[EventMessage], asked: list[int]) -> tuple | None:
        """Step 2 for `asked` (in key order), then `_commit`; every lease a
        completion did not end is given back. Returns `_commit`'s answer, its
        busy joined by the keys leased elsewhere, and the copies of an attempt
        already run; None when it rolled back or nothing was leased."""
        leases: dict[str, Lease] = {}
        passed = None
        try:
            async with self._completions.session() as connection:
                with tracing.spans("lease", [messages[i] for i in asked]):
                    leases = await self._completions.take_leases(
                        connection, _keys(messages, asked), self._store.redlock.ttl_ms
                    )
                handed_on = [
                    i
                    for i in asked
                    if messages[i].key in leases and already_handed_on(messages[i], leases[messages[i].key].handed_on)
                ]
                leased = [i for i in asked if messages[i].key in leases and i not in handed_on]
                lease_keepers = [self._processor.lease_keeper(list(leases.values()))] if leases else []
                async with kept_alive(lease_keepers):  # none when every key is leased elsewhere
                    passed = (
                        await self._commit(connection, messages, leased, leases, lease_keepers[0]) if leased else None
                    )
        finally:
            completed_now = set() if passed is None else {messages[i].key for i in passed[0]}
            await self._completions.release_leases([lease for key, lease in leases.items() if key not in completed_now])
        if passed is None:
            return None
        fresh, completed, busy = passed
        return fresh, completed, busy + [i for i in asked if messages[i].key not in leases], handed_on

    async def _commit(
        self,
        connection: asyncpg.Connection,
        messages: list[EventMessage],
        leased: list[int],
        leases: dict[str, Lease],
        lease_keeper: Keeper,
    ) -> tuple | None:
        """Turns, handlers and completions of the leased keys in one
        transaction, cancelled if the leases are lost meanwhile. Returns the
        indexes completed now, those found completed (with their hash) and
        those whose turn another run holds; None when it rolled back."""
        try:
            with contextlib.ExitStack() as committing:  # the commit's spans end after the COMMIT
                async with self._completions.transaction(connection):
                    with cancelled_when_lost(lease_keeper, connection):
                        return await self._in_transaction(
                            connection, messages, leased, leases, lease_keeper, committing
                        )
        except Exception as exc:
            if found_in_chain(exc, (HandlerFailed, LockLost, _RollBack, *LOCK_CONFLICTS)) is None:
                raise  # a lock conflict of ours rolled the batch back: each event goes alone, as for a failure
            return None

    async def _in_transaction(
        self,
        connection: asyncpg.Connection,
        messages: list[EventMessage],
        leased: list[int],
        leases: dict[str, Lease],
        lease_keeper: Keeper,
        committing: contextlib.ExitStack,
    ) -> tuple:
        turned = await self._completions.take_turns(connection, _keys(messages, leased))
        mine = [i for i in leased if messages[i].key in turned]
        done = await self._completions.completed_keys(connection, _keys(messages, mine))
        completed = {i: done[messages[i].key] for i in mine if messages[i].key in done}
        fresh = [i for i in mine if i not in completed]
        # a stale ordered row completes unrun
        await self._processor.call_handlers(connection, [messages[i] for i in fresh if not _stale(messages[i])])
        lease_keeper.check()  # the leases decide, not the Redis locks (Processor._complete)
        if fresh:
            committing.enter_context(tracing.spans("commit", [messages[i] for i in fresh]))
            completions = [(messages[i], leases[messages[i].key].token) for i in fresh]
            if await self._completions.complete_events(connection, completions) != len(completions):
                raise _RollBack()
        return fresh, completed, [i for i in leased if messages[i].key not in turned]


def _stale(message: EventMessage) -> bool:
    return message.ordered is not None and message.ordered.stale


def _keys(messages: list[EventMessage], indexes: list[int]) -> list[str]:
    return [messages[i].key for i in indexes]


def _split_copies(messages: list[EventMessage]) -> tuple[list[int], dict[int, int]]:
    """Indexes of each key's first message, and every later copy's first."""
    first: dict[str, int] = {}
    copies = {}
    for i, message in enumerate(messages):
        leader = first.setdefault(message.key, i)
        if leader != i:
            copies[i] = leader
    return list(first.values()), copies


async def _all(*coroutines) -> list:
    """Like gather, but a failure cancels the others and is raised as itself
    (the worker tells an outage from a bug by the exception's type)."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(coroutine) for coroutine in coroutines]
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return [task.result() for task in tasks]
