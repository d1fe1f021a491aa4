"""Running a confirmed bulk action on dead letters: the frozen ids, one by
one, paced, through the machinery replays of archived events share
(`shared/runs/paced.py`: pacing, cancellation, resuming, the audit entries).

Each is replayed or discarded only while it is still open
(`replay_if_open`): one that someone else replayed or discarded meanwhile,
or that is not an event, is skipped and counted as such. The audit log's
entries name the dead letters: the frozen ids when the run starts, the ids
acted on when it ends.
"""

import contextlib
from collections.abc import AsyncIterator

from webhook_ingest.shared.audit import Actor
from webhook_ingest.shared.dead_letters import (
    BulkAction,
    ChangedMeanwhile,
    DeadLetterNotFound,
    DeadLetterStore,
    HeldBulk,
    NotReplayable,
)
from webhook_ingest.shared.runs import DEFAULT_RATE, MAX_RATE, PacedRunner

__all__ = ["DEFAULT_RATE", "MAX_RATE", "BulkRunner"]

_SKIPPED = (ChangedMeanwhile, NotReplayable, DeadLetterNotFound)


class BulkRunner(PacedRunner):
    """The bulk actions this process runs; stopped when the ingress shuts down."""

    def start_bulk(self, action: BulkAction, actor: Actor, store: DeadLetterStore, publisher, namespace: str) -> None:
        self.start(_DeadLetterJob(action, actor, store, publisher, namespace))


class _DeadLetterJob:
    """One bulk action, as `paced_runs.run` drives it."""

    def __init__(self, action: BulkAction, actor: Actor, store: DeadLetterStore, publisher, namespace: str):
        self.action, self.actor = action, actor
        self.id, self.name, self.rate = action.id, f"bulk_{action.action}", action.rate or DEFAULT_RATE
        # A discard commits with its step (`act`), or not at all; a replay's publish goes out all the same.
        self.undone_without_its_step = action.action == "discard"
        self._store, self._publisher, self._namespace = store, publisher, namespace
        self._held: HeldBulk | None = None  # the row, while a dead letter is in flight
        self._no_longer_open = False  # the dead letter in flight was skipped as replayed or discarded meanwhile

    async def remaining(self) -> AsyncIterator[int]:
        for dead_letter_id in self.action.remaining:
            yield dead_letter_id

    @contextlib.asynccontextmanager
    async def holding(self) -> AsyncIterator[str | None]:
        async with self._store.held_bulk(self.id) as held:
            self._held = held
            try:
                yield held.state
            finally:
                self._held = None

    async def in_flight(self, dead_letter_id: int) -> str | None:
        assert self._held is not None, "a dead letter is marked in flight while the row is held"
        return await self._held.in_flight(dead_letter_id)

    async def act(self, dead_letter_id: int) -> bool:
        assert self._held is not None, "a dead letter is acted on while the row is held"
        held = self._held.hold.connection  # the act commits with its step, or not at all
        try:
            if self.action.action == "replay":
                if not self._publisher.ready:
                    raise ConnectionError("RabbitMQ is unreachable")
                await self._store.replay_if_open(
                    self._publisher.channel,
                    self._namespace,
                    dead_letter_id,
                    self.actor,
                    bulk_action_id=self.id,
                    held=held,
                )
            else:
                await self._store.discard_if_open(dead_letter_id, self.actor, bulk_action_id=self.id, held=held)
        except _SKIPPED as skipped:
            self._no_longer_open = isinstance(skipped, ChangedMeanwhile)
            return False
        return True

    async def step(self, dead_letter_id: int, acted: bool) -> None:
        assert self._held is not None, "a step is written while the row is held"
        # No longer open though in flight before this runner: acted on by a runner that committed its act apart
        # from its step (the previous release's, during an upgrade) and died between them: done, not skipped;
        # unless someone else's act says it was theirs (another operator's replay or discard meanwhile).
        done = acted or (
            dead_letter_id == self._held.orphaned
            and self._no_longer_open
            and await self._held.acted_apart(dead_letter_id, self.action.action)
        )
        self._no_longer_open = False
        await self._held.step(dead_letter_id, done)

    async def finish(self, state: str, error: str | None) -> None:
        await self._store.finish_bulk(self.id, state, error)

    async def audit(self, what: str, acted: list[int] | None, **detail) -> None:
        ids = self.action.remaining if acted is None else acted
        await self._store.audit_log.record(
            self.actor,
            what,
            ids,
            {"bulk_action_id": self.id, "rate": self.action.rate, "filter": self.action.filter} | detail,
        )
