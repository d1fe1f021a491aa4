"""What a failed attempt of an ordered row becomes: a retry in its place, or
a dead letter that blocks its lane (or is skipped), never a message
(docs/design.md, "Ordering keys").

The second `FailurePolicyPort` (workers/claim/ports.py), for the
`Processor` that runs the lanes' rows. A retry records the next attempt on
the row itself (attempt + 1, the error), sets the lane's `ready_at` to the
retry's delay and lets the lane go, in one statement: no retry queue, no
worker sleeping; the lane's rows behind it wait. The row moves only from
the attempt that failed (compare-and-set), and only while the lane's token
is the runner's, as a dead letter's: a holder that lost its lane moves no
row and delays nothing, its failure a deferral with no attempt handed on —
the lane's new holder, running the same attempt, settles it. A deferral (a
lease or turn held elsewhere, a refused completion) lets the lane go for
that long, no attempt used. A dead letter is recorded as for any event, and
in its transaction the row is kept `dead` with its id, no longer pending,
and the lane blocked by it (`on_dead_letter = "block"`, released) or left
to go on (`"skip"`) — only while the lane's token is the runner's: else the
dead letter rolls back and the failure is the lane's new holder's to settle
(a deferral here, no attempt handed on).
"""

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from webhook_ingest.shared.backoff import pauses
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.event import EventMessage
from webhook_ingest.shared.observability import get_logger, tracing
from webhook_ingest.shared.sources import Source
from webhook_ingest.workers.claim import FailurePolicy, Outcome, describe_failure, failure_of, retry_decision
from webhook_ingest.workers.failures import POSTGRES_LOST, IncidentCounts
from webhook_ingest.workers.handlers import PermanentError

from .store import LaneStore, mark_dead

log = get_logger(__name__)
T = TypeVar("T")


class _NotOurs(Exception):
    """The row's lane is no longer its runner's, or the row moved: its dead letter is not recorded."""


def blocks(source: Source, route: str) -> bool:
    """Whether a dead letter of this source's (route's) lane blocks it; "block" when it is no longer ordered."""
    rule = source.ordering_for(route)
    return rule is None or rule.on_dead_letter == "block"


class OrderedFailurePolicy:
    def __init__(self, store: LaneStore, policy: FailurePolicy, counts: IncidentCounts | None = None):
        self._store = store
        self._policy = policy  # the dead letters' recording, as for any event
        self._counts = counts

    async def fail(self, event: EventMessage, source: Source, exc: BaseException) -> Outcome:
        step = event.ordered
        assert step is not None
        error = describe_failure(exc, event.attempt) | tracing.trace_ids(event)
        retry_in = retry_decision(event, source, exc)
        handler = source.handler_for(event.route)[0]
        if retry_in is None:
            return await self._dead(event, source, error, permanent=isinstance(exc, PermanentError))
        moved = await self._waiting_for_postgres(
            lambda: self._store.retry_in_place(step.lane, step.token, step.seq, event.attempt, error, retry_in)
        )
        if moved is None:  # the lane has another holder, running this attempt: its outcome settles the row
            log.warning("ordered_retry_dropped", lane=step.lane, seq=step.seq, error_type=error["type"])
            return Outcome.DEFERRED
        log.warning("event_retry_scheduled", retry_in=retry_in, error_type=error["type"], error=error["message"][:200])
        if self._counts is not None:
            self._counts.note(failure_of(event, handler, error))
        return Outcome.RETRIED

    async def dead_unrun(self, event: EventMessage, source: Source, error: dict) -> Outcome:
        """A row not run at all (its worker died running it past the delivery limit): its dead letter, as `fail`'s."""
        return await self._dead(event, source, error)

    async def _dead(self, event: EventMessage, source: Source, error: dict, permanent: bool = False) -> Outcome:
        """The row's dead letter, the row kept dead in its transaction; deferred (nothing
        recorded, nothing handed on) when the row is no longer ours to settle: the lane
        has another holder, or the row moved (docs/design.md, "Ordering keys")."""
        step = event.ordered
        assert step is not None
        block = blocks(source, event.route)

        async def kept_dead(connection, dead_letter_id: int) -> None:
            errors = (*event.errors, error)
            if not await mark_dead(
                connection, step.lane, step.token, step.seq, event.attempt, dead_letter_id, block, errors
            ):
                raise _NotOurs()  # the dead letter's transaction rolls back

        handler = source.handler_for(event.route)[0]
        try:
            dead_letter_id = await self._policy.dead_letter(
                event, error, permanent=permanent, handler=handler, beside=kept_dead
            )
        except _NotOurs:
            log.warning("ordered_dead_letter_dropped", lane=step.lane, seq=step.seq, error_type=error["type"])
            return Outcome.DEFERRED
        return Outcome.DEAD if dead_letter_id is not None else Outcome.DUPLICATE  # None: completed meanwhile

    async def delay(self, event: EventMessage, delay_seconds: float) -> None:
        """The lane let go for `delay_seconds`, no attempt used; best effort: a lease not let go runs out."""
        step = event.ordered
        assert step is not None
        try:
            await self._store.release(step.lane, step.token, delay_seconds)
        except Exception as exc:  # noqa: BLE001 - Postgres away: the lease runs out instead
            log.info("lane_release_failed", lane=step.lane, error=describe(exc))

    @staticmethod
    async def _waiting_for_postgres(write: Callable[[], Awaitable[T]]) -> T:
        """The retry's record, returned only once committed: the handler ran,
        and running it again because Postgres blinked would repeat its calls."""
        for pause in pauses():
            try:
                return await write()
            except (*POSTGRES_LOST, OSError, asyncio.TimeoutError) as exc:
                log.warning("retry_waiting_for_postgres", error=describe(exc), retry_in=pause)
                await asyncio.sleep(pause)
        raise AssertionError("pauses() never ends")
