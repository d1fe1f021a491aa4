"""Running a confirmed bulk action: the frozen ids, one by one, paced.

Dead letter n is acted on no sooner than n / rate seconds after the start,
so a bulk replay of ten thousand never floods the workers. Each is replayed
or discarded only while it is still open (`replay_if_open`): one that
someone else replayed or discarded meanwhile, or that is not an event, is
skipped and counted as such. Progress is written after each, so the page —
served by any ingress process — shows it, and a run that stopped (the
broker failed, the process ended) resumes with what is left.

The audit log gets one entry when the run starts (the frozen ids) and one
when it ends (the ids acted on).
"""

import asyncio
import contextlib

from webhook_ingest.shared.bulk_actions import BulkAction
from webhook_ingest.shared.dead_letter_store import DeadLetterStore
from webhook_ingest.shared.dead_letters import Actor, ChangedMeanwhile, DeadLetterNotFound, NotReplayable
from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.logging import get_logger

log = get_logger(__name__)

MAX_RATE = 1000.0
DEFAULT_RATE = 10.0
_SKIPPED = (ChangedMeanwhile, NotReplayable, DeadLetterNotFound)


class BulkRunner:
    """The bulk actions this process runs; stopped when the ingress shuts down."""

    def __init__(self):
        self._tasks: set[asyncio.Task] = set()

    def start(self, action: BulkAction, actor: Actor, store: DeadLetterStore, publisher, namespace: str) -> None:
        run = _Run(action, actor, store, publisher, namespace)
        task = asyncio.create_task(run.run(), name=f"bulk-action-{action.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self, _app=None) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class _Run:
    """One bulk action, from its first remaining id to its last."""

    def __init__(self, action: BulkAction, actor: Actor, store: DeadLetterStore, publisher, namespace: str):
        self.action, self.actor = action, actor
        self._store, self._publisher, self._namespace = store, publisher, namespace

    async def run(self) -> None:
        action = self.action
        acted: list[int] = []
        await self._audit(f"bulk_{action.action}_started", action.remaining)
        try:
            state, error = await self._steps(acted), None
        except asyncio.CancelledError:
            state, error = "failed", "the ingress stopped during the run; resume it"
            raise
        except Exception as exc:  # noqa: BLE001 - broker or Postgres failed: resumable
            state, error = "failed", describe(exc)
            log.warning("bulk_action_failed", bulk_action_id=action.id, error=error)
        finally:
            await asyncio.shield(self._finish(acted, state, error))

    async def _steps(self, acted: list[int]) -> str:
        action = self.action
        rate = action.rate or DEFAULT_RATE  # claim() always sets it
        loop = asyncio.get_running_loop()
        started = loop.time()
        for n, dead_letter_id in enumerate(action.remaining):
            await asyncio.sleep(max(0.0, started + n / rate - loop.time()))
            if await self._store.bulk_state(action.id) != "running":
                return "cancelled"
            done = await self._act(dead_letter_id)
            await self._store.bulk_step(action.id, dead_letter_id, done)
            if done:
                acted.append(dead_letter_id)
        return "done"

    async def _act(self, dead_letter_id: int) -> bool:
        action, actor = self.action, self.actor
        try:
            if action.action == "replay":
                if not self._publisher.ready:
                    raise ConnectionError("RabbitMQ is unreachable")
                await self._store.replay_if_open(self._publisher.channel, self._namespace, dead_letter_id, actor,
                                                 bulk_action_id=action.id)
            else:
                await self._store.discard_if_open(dead_letter_id, actor, bulk_action_id=action.id)
        except _SKIPPED:
            return False
        return True

    async def _finish(self, acted: list[int], state: str, error: str | None) -> None:
        action = self.action
        with contextlib.suppress(Exception):  # noqa: BLE001 - Postgres away: the page shows it still running
            if state != "cancelled":
                await self._store.finish_bulk(action.id, state, error)
        await self._audit(f"bulk_{action.action}", acted, state=state)

    async def _audit(self, what: str, ids: list[int], **detail) -> None:
        action = self.action
        with contextlib.suppress(Exception):  # noqa: BLE001 - logged instead when Postgres is away
            await self._store.record_audit(self.actor, what, ids,
                                           {"bulk_action_id": action.id, "rate": action.rate, "filter": action.filter}
                                           | detail)
            return
        log.warning("bulk_action_audit_lost", bulk_action_id=action.id, action=what, ids=ids)
