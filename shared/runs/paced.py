"""Acting on a frozen set one item at a time: paced, cancellable, resumable,
audited — the machinery the dead letters' bulk actions and the replays of
archived events share (docs/reference.md §8.1, §8).

Item n is acted on no sooner than n / rate seconds after the start, so ten
thousand never flood the workers. Each item is one hold of the run
(`job.holding()`, `shared/runs/locks.py`): its state read under the lock,
"item n in flight" committed (`job.in_flight`), the item acted on, its
progress written, then the lock let go. Another process (the console's
Cancel, `events replay --cancel`) ends the run by writing `cancelled`,
which waits for an item in flight: once it returns, nothing more is acted
on, and an item its runner marked in flight but never stepped (it died
mid-publish) is counted as one that may have been acted on. Progress is
written with each item, so any process shows it, and a run that stopped
(the broker or Postgres failed, the process ended) resumes with what is
left, the item in flight included. The audit log gets one entry when the
run starts and one when it ends.

What an item is, how it is acted on and where progress lives is the job's
(`PacedJob`): `ingress/console/bulk.py` for dead letters,
`shared/replays/store.py` for archived events.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Protocol

from webhook_ingest.shared.errors import describe
from webhook_ingest.shared.observability import get_logger

if TYPE_CHECKING:
    from aiohttp import web

log = get_logger(__name__)

MAX_RATE = 1000.0
TAKEN_OVER = "taken_over"  # a job's state() for a run another process claimed since (it stalled): stop, finish nothing
MIN_RATE = 0.1  # slower, a run could sleep for ever, and its stall (30 s + 2/rate) overflow Postgres
DEFAULT_RATE = 10.0


class PacedJob(Protocol):
    id: int
    name: str  # the audit log's action: NAME_started, then NAME
    rate: float
    # True when the act commits with its step or not at all (a bulk discard): it counts acted on only once the
    # item's hold committed. False when the act may take effect though its step is lost (a publish went out):
    # acted on as soon as `act` says so.
    undone_without_its_step: bool

    def remaining(self) -> AsyncIterator[Any]: ...

    def holding(self) -> AbstractAsyncContextManager[str | None]:
        """The run's row locked for one item (`shared/runs/locks.py`), its state
        read under the lock: `act` and `step` run inside, and a cancel waits."""

    async def in_flight(self, item: Any) -> str | None:
        """ "`item` in flight" committed (`run_locks.Hold.in_flight`), the run still
        held; its state read again, as `holding()`'s, after the commit."""

    async def act(self, item: Any) -> bool:
        """True when acted on, False when skipped."""

    async def step(self, item: Any, acted: bool) -> None:
        """The item's progress, written in `holding`'s transaction."""

    async def finish(self, state: str, error: str | None) -> None: ...

    async def audit(self, what: str, acted: list[Any] | None, **detail: object) -> None:
        """One audit entry; `acted` the items acted on, None when the run starts
        (the job says what it is about to act on)."""


async def run(job: PacedJob) -> str:
    """The job from its first remaining item to its last; its end state."""
    acted: list[Any] = []
    await _audit(job, f"{job.name}_started", None)
    state, error = "failed", None
    try:
        state = await _steps(job, acted)
    except asyncio.CancelledError:
        state, error = "failed", "the process stopped during the run; resume it"
        raise
    except Exception as exc:  # noqa: BLE001 - broker or Postgres failed: resumable
        state, error = "failed", describe(exc)
        log.warning("paced_run_failed", job=job.name, id=job.id, error=error)
    finally:
        await asyncio.shield(_finish(job, acted, state, error))
    return state


async def _steps(job: PacedJob, acted: list[Any]) -> str:
    loop = asyncio.get_running_loop()
    started, n = loop.time(), 0
    async for item in job.remaining():
        await asyncio.sleep(max(0.0, started + n / job.rate - loop.time()))
        n += 1
        done = False
        async with job.holding() as seen:
            if seen != "running":
                return TAKEN_OVER if seen == TAKEN_OVER else "cancelled"
            # Before the act: a cancel behind a runner that dies in it learns of it. Read again after the
            # mark's commit, which lets the row go to a writer that does not take the run's lock.
            seen = await job.in_flight(item)
            if seen != "running":
                return TAKEN_OVER if seen == TAKEN_OVER else "cancelled"
            done = await job.act(item)
            if done and not job.undone_without_its_step:
                acted.append(item)  # acted on, whether or not its step commits
            await job.step(item, done)
        if done and job.undone_without_its_step:
            acted.append(item)  # its act committed with its step, as the hold ended
    # No item left: still this runner's run? One frozen past a Cancel or a takeover (a suspended VM) may
    # find none because an ended replay's items were pruned meanwhile (shared/upkeep.py).
    async with job.holding() as seen:
        if seen != "running":
            return TAKEN_OVER if seen == TAKEN_OVER else "cancelled"
    return "done"


async def _finish(job: PacedJob, acted: list[Any], state: str, error: str | None) -> None:
    with contextlib.suppress(Exception):  # Postgres away: it shows running, resumable later
        if state not in ("cancelled", TAKEN_OVER):
            await job.finish(state, error)
    await _audit(job, job.name, acted, state=state)


async def _audit(job: PacedJob, what: str, acted: list[Any] | None, **detail: object) -> None:
    with contextlib.suppress(Exception):  # logged instead when Postgres is away
        await job.audit(what, acted, **detail)
        return
    log.warning("paced_run_audit_lost", job=job.name, id=job.id, action=what, count=len(acted or ()))


class PacedRunner:
    """The paced runs this process runs in the background; stopped with it."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task] = set()

    def start(self, job: PacedJob) -> None:
        task = asyncio.create_task(run(job), name=f"{job.name}-{job.id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def stop(self, _app: "web.Application | None" = None) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
