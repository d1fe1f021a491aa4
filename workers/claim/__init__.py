"""webhook_ingest.workers.claim: what each of its modules holds.

- processor      One message, one pass through the idempotency state machine.
- batch          Many events, few round trips
- states         The idempotency model as plain code: what a key's claim can say, and what became of an event.
- copies         Copies of an event that reach a worker while it is still working on the first one wait for it …
- attempts       One failed attempt leads to at most one next attempt, whatever the broker does.
- lease          The key's lease in Postgres, and keeping a lock or a lease alive.
- redlock        Redlock over independent Redis masters, written here on redis.asyncio.
- renewals       A worker's lease and lock renewals, a few round trips at a time.
- coalesced      A worker's short statements, many runs' in one.
- completions    The workers' Postgres
- ports          The claim path's stores as Protocols, implemented by the real stores and the tests' stand-ins.
- handler_db     `ctx.db`: the handler's transaction, opened at its first use.
- idempotency    The Redis side of idempotency: claim a key, remember its completion.
- retry          What a failed attempt becomes: a delayed retry through RabbitMQ, or a dead letter.
- archive_notes  A worker's part of the event archive (docs/design.md, "The archive")
- loop_lag       How long the event loop stood still: tells a busy loop from a black hole.
"""

from .archive_notes import ArchiveNotes
from .batch import BatchProcessor
from .completions import CompletionStore
from .copies import CopiesInFlight
from .idempotency import IdempotencyStore
from .lease import Keeper, Lease, kept_alive
from .ports import WorkerCompletionsPort
from .processor import DEFER_SECONDS, Processor
from .retry import FailurePolicy, describe_failure, failure_of, retry_decision
from .states import Outcome

__all__ = [
    "DEFER_SECONDS",
    "ArchiveNotes",
    "BatchProcessor",
    "CompletionStore",
    "CopiesInFlight",
    "FailurePolicy",
    "IdempotencyStore",
    "Keeper",
    "Lease",
    "Outcome",
    "Processor",
    "WorkerCompletionsPort",
    "describe_failure",
    "failure_of",
    "kept_alive",
    "retry_decision",
]
