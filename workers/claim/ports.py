"""The claim path's ports: what the processor, the batch, `ctx.db`, the
coalesced statements and the renewals ask of their stores, as `Protocol`s.

Each is implemented by the real store and by the tests' stand-ins, and
mypy checks both (`make lint` runs it over `tests/support/in_memory.py`,
whose last lines assign each stand-in to its port):

- `CompletionStorePort`: `CompletionStore` (Postgres, workers/claim/completions.py)
  and `InMemoryCompletions` (tests/support/in_memory.py), which the
  simulation's server keeps and its `Client` wraps (tests/sim/postgres.py);
  `WorkerCompletionsPort` adds what `workers.worker` asks of it besides.
- `IdempotencyStorePort`: `IdempotencyStore` (Redis, workers/claim/idempotency.py)
  and `InMemoryClaims`. The simulation runs the real one on simulated
  Redis clients (tests/sim/fake_redis.py).
- `FailurePolicyPort`: `FailurePolicy` (RabbitMQ and the dead letters,
  workers/claim/retry.py) and `RecordingFailures`.

A store's sessions are its own type (an asyncpg connection, the in-memory
`Session`): the ports are generic in it, and the claim path only hands
back to a store the sessions that store gave it.
"""

from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol, TypeVar

from webhook_ingest.shared.event import EventMessage
from webhook_ingest.shared.sources import Source

from .completions import Settled
from .idempotency import Claim
from .lease import Lease
from .redlock import Lock
from .states import Outcome

ConnectionT = TypeVar("ConnectionT")


class CompletionStorePort(Protocol[ConnectionT]):
    """A key's fence (lease, fencing token, attempt handed on), its turn and its completion."""

    # -- sessions and transactions
    def session(self) -> AbstractAsyncContextManager[ConnectionT]: ...
    def statement(self) -> AbstractAsyncContextManager[ConnectionT]: ...
    def transaction(self, connection: ConnectionT) -> AbstractAsyncContextManager[object]: ...

    # -- the key's lease and fencing token
    async def take_leases(self, connection: ConnectionT, keys: list[str], ttl_ms: int) -> dict[str, Lease]: ...
    async def extend_leases(self, leases: list[Lease], ttl_ms: int) -> set[tuple[str, int]]: ...
    async def release_leases(self, leases: list[Lease]) -> None: ...
    async def record_handed_on(self, message: EventMessage) -> None: ...

    # -- in the handler's transaction, or a statement of its own
    async def take_turn(self, connection: ConnectionT, key: str) -> bool: ...
    async def take_turns(self, connection: ConnectionT, keys: list[str]) -> set[str]: ...
    async def check_completed(self, connection: ConnectionT, keys: list[str]) -> dict[str, str]: ...
    async def completed_keys(self, connection: ConnectionT, keys: list[str]) -> dict[str, str]: ...
    async def complete_event(self, connection: ConnectionT, message: EventMessage, token: int) -> bool: ...
    async def complete_events(
        self, connection: ConnectionT, completions: Sequence[tuple[EventMessage, int]]
    ) -> int: ...
    async def complete_alone(
        self, connection: ConnectionT, completions: Sequence[tuple[EventMessage, int]]
    ) -> set[str]: ...

    # -- on a connection of their own
    async def completed_sha256(self, key: str, connection: ConnectionT | None = None) -> str | None: ...
    async def record_conflict(self, message: EventMessage, completed_sha256: str) -> None: ...
    async def expire_sessions(self) -> None: ...


class WorkerCompletionsPort(CompletionStorePort[ConnectionT], Protocol[ConnectionT]):
    """The claim path's store, and what the worker asks of it around a delivery."""

    async def settled_before(self, message: EventMessage) -> Settled: ...
    async def probe_writable(self) -> None: ...


class LockTtl(Protocol):
    """What the claim path reads of the Redis lock: how long it lasts (a lease lasts as long)."""

    @property
    def ttl_ms(self) -> int: ...


class IdempotencyStorePort(Protocol):
    """A key's claim in Redis (a lock, or a done marker), and its completion there."""

    @property
    def redlock(self) -> LockTtl: ...

    async def claim(self, idempotency_key: str) -> Claim: ...
    async def claim_many(self, idempotency_keys: list[str]) -> list[Claim]: ...
    async def extend_many(self, locks: list[Lock]) -> list[Lock | None]: ...
    async def release(self, lock: Lock) -> None: ...
    async def complete(self, idempotency_key: str, payload_sha256: str) -> None: ...
    async def complete_many(self, completions: list[tuple[str, str]]) -> None: ...


class FailurePolicyPort(Protocol):
    """What a failed attempt becomes (a retry, a dead letter), and a deferral."""

    async def fail(self, event: EventMessage, source: Source, exc: BaseException) -> Outcome: ...
    async def delay(self, event: EventMessage, delay_seconds: float) -> None: ...
