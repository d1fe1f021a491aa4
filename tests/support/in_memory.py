"""The worker's stores without Postgres or Redis, for unit tests of the
processor's state machine — as procrastinate tests its manager against an
`InMemoryConnector`.

`InMemoryCompletions` has `CompletionStore`'s methods (workers/claim/completions.py)
and the meaning of their statements (workers/queries.sql), on dicts: each
key's fence (lease, fencing token, last attempt handed on), its turn (held
by one session until its transaction ends), its completion, the conflicts,
the open dead letters a completion closes. A session's writes inside a
transaction are undone when the transaction ends in an exception, as a
rollback would. `InMemoryClaims` stands for `IdempotencyStore` (Redis: a
lock or a done marker per key), `RecordingFailures` for `FailurePolicy`
(the retry decision is the real, pure one; nothing is published).

Each implements its port (workers/claim/ports.py): the assignments at the
end of this file make mypy (`make lint`) check every method's signature
against the port's, so a stand-in that drifts from its store fails lint.
"""

import asyncio
import contextlib
import itertools
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from webhook_ingest.shared.event.message import EventMessage
from webhook_ingest.shared.sources.model import Source
from webhook_ingest.workers.claim.attempts import HandedOn
from webhook_ingest.workers.claim.completions import PRUNE_BATCH, Settled
from webhook_ingest.workers.claim.idempotency import Claim
from webhook_ingest.workers.claim.lease import Lease
from webhook_ingest.workers.claim.redlock import Lock
from webhook_ingest.workers.claim.retry import retry_decision
from webhook_ingest.workers.claim.states import ClaimState, Outcome


class Session:
    """Stands for a pooled asyncpg connection (what a handler gets as `ctx.db`)."""

    def __init__(self) -> None:
        self.undo: list[Callable[[], object]] | None = None  # inside a transaction: how to roll it back
        self.terminated = False
        self.statements: list[str] = []  # what a handler sent through ctx.db

    async def execute(self, query: str, *args: object) -> str:
        self.statements.append(query)
        return "INSERT 0 1"

    def terminate(self) -> None:
        self.terminated = True

    def is_closed(self) -> bool:
        return self.terminated


@dataclass
class Fence:
    """A `key_fences` row."""

    token: int
    lease_until: float | None  # time.monotonic(); None: ended (a completion, a release)
    handed_on: HandedOn = field(default_factory=HandedOn)
    updated_at: float = 0.0  # time.time()


@dataclass(frozen=True)
class Completion:
    """A `processed_events` row."""

    payload_sha256: str
    message_id: str | None
    token: int
    completed_at: float  # time.time()
    arrival: int | None = None  # the arrival that ran; None: its message carried none


class InMemoryCompletions:
    def __init__(self, pool_size: int | None = None) -> None:
        # a bounded pool of handler-transaction sessions: `session()` waits for one
        self._pool = contextlib.nullcontext() if pool_size is None else asyncio.Semaphore(pool_size)
        self.fences: dict[str, Fence] = {}
        self.completions: dict[str, Completion] = {}
        self.conflicts: list[tuple[str, str, str]] = []  # key, completed hash, conflicting hash
        self.open_dead_letters: set[tuple[str, str]] = set()  # key, payload hash
        self.turns: dict[str, Session] = {}
        self.renewals_answer = True  # False: extend_leases says the leases are not ours any more
        self._tokens = itertools.count(1)

    # -- sessions and transactions --------------------------------------------

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[Session]:
        async with self._pool:
            yield Session()

    @contextlib.asynccontextmanager
    async def statement(self) -> AsyncIterator[Session]:
        """A session for short statements: a pool of its own, never the handlers'."""
        yield Session()

    @contextlib.asynccontextmanager
    async def transaction(self, connection: Session) -> AsyncIterator[None]:
        connection.undo = []
        try:
            yield
        except BaseException:
            for undo in reversed(connection.undo):
                undo()
            raise
        finally:
            connection.undo = None
            for key in [key for key, holder in self.turns.items() if holder is connection]:
                del self.turns[key]  # a transaction-scoped advisory lock

    def _write(self, session: Session | None, undo: Callable[[], object]) -> None:
        if session is not None and session.undo is not None:
            session.undo.append(undo)

    # -- leases and fencing tokens ---------------------------------------------

    def hold_lease(self, key: str, seconds: float = 60.0) -> Fence:
        """Another run's lease on `key` (test set-up)."""
        fence = self.fences[key] = Fence(next(self._tokens), time.monotonic() + seconds, updated_at=time.time())
        return fence

    async def take_leases(self, connection: Session, keys: list[str], ttl_ms: int) -> dict[str, Lease]:
        sent_at = time.monotonic()
        granted = {}
        for key in sorted(keys):
            fence = self.fences.get(key)
            if fence is not None and fence.lease_until is not None and fence.lease_until >= time.monotonic():
                continue
            handed_on = HandedOn() if fence is None else fence.handed_on
            self.fences[key] = Fence(next(self._tokens), time.monotonic() + ttl_ms / 1000, handed_on, time.time())
            granted[key] = Lease(key, self.fences[key].token, sent_at, handed_on)
        return granted

    async def extend_leases(self, leases: list[Lease], ttl_ms: int) -> set[tuple[str, int]]:
        if not self.renewals_answer:
            return set()
        ours = [lease for lease in leases if self._ours(lease.key, lease.token)]
        for lease in ours:
            self.fences[lease.key].lease_until = time.monotonic() + ttl_ms / 1000
        return {(lease.key, lease.token) for lease in ours}

    async def release_leases(self, leases: list[Lease]) -> None:
        for lease in leases:
            if lease.key in self.fences and self.fences[lease.key].token == lease.token:
                self.fences[lease.key].lease_until = None

    async def record_handed_on(self, message: EventMessage) -> None:
        fence = self.fences.setdefault(message.key, Fence(next(self._tokens), None))
        if (fence.handed_on.replay_of, fence.handed_on.attempt) < (message.replay_of, message.attempt):
            fence.handed_on, fence.updated_at = handed_on(message), time.time()

    def _ours(self, key: str, token: int) -> bool:
        fence = self.fences.get(key)
        return fence is not None and fence.token == token and fence.lease_until is not None

    # -- in the handler's transaction ------------------------------------------

    async def take_turn(self, connection: Session, key: str) -> bool:
        holder = self.turns.setdefault(key, connection)
        return holder is connection

    async def take_turns(self, connection: Session, keys: list[str]) -> set[str]:
        return {key for key in keys if await self.take_turn(connection, key)}

    async def completed_keys(self, connection: Session, keys: list[str]) -> dict[str, str]:
        return {key: self.completions[key].payload_sha256 for key in keys if key in self.completions}

    async def check_completed(self, connection: Session, keys: list[str]) -> dict[str, str]:
        return await self.completed_keys(connection, keys)

    async def complete_event(self, connection: Session, message: EventMessage, token: int) -> bool:
        """Refused unless `token` is current; the fence's lease ends even when
        the key is completed already (the statement's CTEs run either way)."""
        fence = self.fences.get(message.key)
        if fence is None or fence.token != token:
            return False
        lease_until, fence.lease_until = fence.lease_until, None
        self._write(connection, lambda: setattr(fence, "lease_until", lease_until))
        dead_letter = (message.key, message.payload_sha256)
        if dead_letter in self.open_dead_letters:
            self.open_dead_letters.discard(dead_letter)
            self._write(connection, lambda: self.open_dead_letters.add(dead_letter))
        if message.key in self.completions:
            return False
        self.completions[message.key] = Completion(
            message.payload_sha256, message.message_id or None, token, time.time(), message.arrival or None
        )
        self._write(connection, lambda: self.completions.pop(message.key))
        return True

    async def complete_events(self, connection: Session, completions: Sequence[tuple[EventMessage, int]]) -> int:
        return sum([await self.complete_event(connection, message, token) for message, token in completions])

    # -- on a connection of their own ------------------------------------------

    async def complete_alone(self, connection: Session, completions: Sequence[tuple[EventMessage, int]]) -> set[str]:
        return {message.key for message, token in completions if await self.complete_event(connection, message, token)}

    async def completed_sha256(self, key: str, connection: Session | None = None) -> str | None:
        completion = self.completions.get(key)
        return None if completion is None else completion.payload_sha256

    async def record_conflict(self, message: EventMessage, completed_sha256: str) -> None:
        self.conflicts.append((message.key, completed_sha256, message.payload_sha256))

    async def settled_before(self, message: EventMessage) -> Settled:
        completion = self.completions.get(message.key)
        return Settled(
            completion is not None and completion.message_id == message.message_id,
            (message.key, message.payload_sha256) in self.open_dead_letters,
        )

    async def probe_writable(self) -> None:
        """Always writable."""

    async def expire_sessions(self) -> None:
        """No sessions to renew."""

    async def prune(self, window: timedelta, batch_size: int = PRUNE_BATCH) -> int:
        cutoff = time.time() - window.total_seconds()
        old = [key for key, completion in self.completions.items() if completion.completed_at < cutoff]
        for key in old:
            del self.completions[key]
            if key in self.fences:  # the attempt record goes with the completion
                self.fences[key].handed_on = HandedOn()
        for key in [
            key
            for key, fence in self.fences.items()
            if fence.updated_at < cutoff and (fence.lease_until is None or fence.lease_until < time.monotonic())
        ]:
            del self.fences[key]
        return len(old)


@dataclass
class LockTtl:
    """What the claim path reads of `Redlock`: its TTL (a test may shorten it)."""

    ttl_ms: int


class InMemoryClaims:
    """IdempotencyStore without Redis: a lock or a done marker per key."""

    def __init__(self, lock_ttl_ms: int = 3000) -> None:
        self.redlock = LockTtl(lock_ttl_ms)
        self.locks: dict[str, Lock] = {}
        self.done: dict[str, str] = {}
        self.unavailable = False  # no quorum: degraded mode

    async def claim(self, idempotency_key: str) -> Claim:
        if self.unavailable:
            return Claim(ClaimState.UNAVAILABLE)
        if idempotency_key in self.done:
            return Claim(ClaimState.COMPLETED, completed_sha256=self.done[idempotency_key])
        if idempotency_key in self.locks:
            return Claim(ClaimState.BUSY)
        lock = self.locks[idempotency_key] = Lock(
            idempotency_key, uuid.uuid4().hex, time.monotonic() + self.redlock.ttl_ms / 1000
        )
        return Claim(ClaimState.ACQUIRED, lock=lock)

    async def claim_many(self, idempotency_keys: list[str]) -> list[Claim]:
        return [await self.claim(key) for key in idempotency_keys]

    async def extend_many(self, locks: list[Lock]) -> list[Lock | None]:
        return [lock if self.locks.get(lock.key) == lock else None for lock in locks]

    async def release(self, lock: Lock) -> None:
        if self.locks.get(lock.key) == lock:
            del self.locks[lock.key]

    async def complete(self, idempotency_key: str, payload_sha256: str) -> None:
        if self.unavailable:
            return  # Redis is away: the marker is best effort
        self.locks.pop(idempotency_key, None)
        self.done[idempotency_key] = payload_sha256

    async def complete_many(self, completions: list[tuple[str, str]]) -> None:
        for key, payload_sha256 in completions:
            await self.complete(key, payload_sha256)


class RecordingFailures:
    """FailurePolicy without a broker: the real retry decision, recorded."""

    def __init__(self) -> None:
        self.delayed: list[tuple[str, float]] = []
        self.failed: list[BaseException] = []

    async def delay(self, event: EventMessage, delay_seconds: float) -> None:
        self.delayed.append((event.key, delay_seconds))

    async def fail(self, event: EventMessage, source: Source, exc: BaseException) -> Outcome:
        self.failed.append(exc)
        return Outcome.DEAD if retry_decision(event, source, exc) is None else Outcome.RETRIED


@dataclass
class Lane:
    rows: list[Any] = field(default_factory=list)  # workers.ordering.store.PendingRow, pending, in run order
    token: int = 0
    holder: str | None = None
    lease_until: float | None = None  # time.monotonic()
    ready_at: float | None = None


class InMemoryLanes:
    """workers/ordering/store.py's LaneStore without Postgres: a lane's lease
    and token, its pending rows, release_if_idle; `advance` is what a
    completion does to the lane (workers/queries.sql)."""

    def __init__(self):
        self.lanes: dict[str, Lane] = {}
        self._tokens = itertools.count(1)
        self.released: list[str] = []
        self.looks = 0  # the watchdog's statements (runnable, sources_with_rows)

    def add(self, lane: str, *rows: Any) -> None:
        self.lanes.setdefault(lane, Lane()).rows.extend(rows)

    def _ours(self, lane: str, token: int) -> Lane | None:
        found = self.lanes.get(lane)
        return found if found is not None and found.token == token and found.lease_until is not None else None

    def advance(self, lane: str, token: int, seq: int) -> bool:
        """The completion's advance: the row deleted while `token` is the lane's."""
        found = self._ours(lane, token)
        if found is None:
            return False
        found.rows = [row for row in found.rows if row.seq != seq]
        return True

    async def take(self, lane: str, holder: str, ttl_ms: int) -> Any:
        from webhook_ingest.workers.ordering.store import Taken

        found = self.lanes.get(lane)
        now = time.monotonic()
        if found is None or not found.rows or (found.lease_until is not None and found.lease_until > now):
            return None
        if found.ready_at is not None and found.ready_at > now:
            return None
        expired = found.holder is not None
        found.token, found.holder, found.lease_until, found.ready_at = (
            next(self._tokens),
            holder,
            now + ttl_ms / 1000,
            None,
        )
        return Taken(found.token, expired)

    async def extend(self, lanes: Sequence[tuple[str, int]], ttl_ms: int) -> set[tuple[str, int]]:
        extended = set()
        for lane, token in lanes:
            found = self._ours(lane, token)
            if found is not None:
                found.lease_until = time.monotonic() + ttl_ms / 1000
                extended.add((lane, token))
        return extended

    async def page(self, lane: str, token: int, size: int, hold_seconds: float) -> Any:
        from webhook_ingest.workers.ordering.store import Page

        found = self.lanes.get(lane)
        if found is None:
            return Page(False, None, None, ())
        return Page(self._ours(lane, token) is not None, None, None, tuple(found.rows[:size]))

    async def finish(self, lane: str, token: int, seq: int) -> bool:
        return self.advance(lane, token, seq)

    async def release_if_idle(self, lane: str, token: int) -> Any:
        from webhook_ingest.workers.ordering.store import Idle

        found = self._ours(lane, token)
        if found is None:
            return Idle(False, False)
        if found.rows:
            return Idle(True, False)
        found.holder = found.lease_until = None
        self.released.append(lane)
        return Idle(True, True)

    async def release(self, lane: str, token: int, ready_in: float | None = None) -> bool:
        found = self.lanes.get(lane)
        if found is None or found.token != token:
            return False
        found.holder = found.lease_until = None
        if ready_in is not None:
            found.ready_at = time.monotonic() + ready_in
        self.released.append(lane)
        return True

    async def take_many(self, lanes: Sequence[str], holder: str, ttl_ms: int) -> dict[str, Any]:
        taken = {lane: await self.take(lane, holder, ttl_ms) for lane in lanes}
        return {lane: each for lane, each in taken.items() if each is not None}

    async def pages(self, lanes: Sequence[tuple[str, int, float]], size: int) -> dict[str, Any]:
        return {lane: await self.page(lane, token, size, hold) for lane, token, hold in lanes}

    async def release_many_if_idle(self, lanes: Sequence[tuple[str, int]]) -> dict[str, Any]:
        return {lane: await self.release_if_idle(lane, token) for lane, token in lanes}

    async def runnable(
        self, sources: Sequence[str], limit: int, within: float = 1.0, routes: Sequence[str] = ()
    ) -> list[tuple[str, float]]:
        now = time.monotonic()
        found = []
        for name, lane in self.lanes.items():
            head = name.partition(":")[0]
            source, _, route = head.partition("#")
            if not lane.rows or source not in sources or (route and head not in routes):
                continue
            waits = [at - now for at in (lane.lease_until, lane.ready_at) if at is not None]
            wait = max([0.0, *waits])
            if wait < within:
                found.append((name, wait))
        self.looks += 1
        return found[:limit]

    async def sources_with_rows(self) -> set[str]:
        self.looks += 1
        return {name.partition(":")[0].partition("#")[0] for name, lane in self.lanes.items() if lane.rows}


def handed_on(message: EventMessage) -> HandedOn:
    """What `record_handed_on` writes for `message`: the fields HandedOn has
    (its payload hash since adversary finding B3)."""
    written: dict[str, Any] = {
        "replay_of": message.replay_of,
        "attempt": message.attempt,
        "payload_sha256": message.payload_sha256,
    }
    return HandedOn(**{name: value for name, value in written.items() if name in HandedOn.__dataclass_fields__})


if TYPE_CHECKING:  # mypy's check that the stand-ins still implement the claim path's ports
    from webhook_ingest.workers.claim.ports import (
        FailurePolicyPort,
        IdempotencyStorePort,
        WorkerCompletionsPort,
    )

    _completions: WorkerCompletionsPort[Session] = InMemoryCompletions()
    _claims: IdempotencyStorePort = InMemoryClaims()
    _failures: FailurePolicyPort = RecordingFailures()
