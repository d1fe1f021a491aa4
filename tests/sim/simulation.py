"""One simulated run: real workers on simulated services, in virtual time.

Each worker process is the real `Worker`, started with its real `run()`
(pools, Redis store, broker connection, queue declarations, consuming,
and on SIGTERM its real shutdown), on the fakes of `tests.sim.broker`,
`tests.sim.fake_redis` and `tests.sim.postgres`. The ingress is the
broker's publish of each planned send; the plan's faults and operator
actions happen at their times (`tests.sim.faults`, `tests.sim.operators`).
The ledger (`tests.sim.invariants`) is told of every handler run, effect
and settled message, and checks as they happen. After the plan's last
step the run waits for the system to go quiet — nothing in any queue, no
delivery unsettled, no worker busy — then stops every worker and checks
that every accepted event is settled. A run that does not go quiet within
`SETTLE_LIMIT` virtual seconds is a violation too: something waits for ever.
"""

import asyncio
import contextvars
import itertools
import random
import sys
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import orjson

from tests.sim import faults as fault_steps
from tests.sim import known, operators
from tests.sim.broker import Broker, Connection, Envelope
from tests.sim.fake_redis import Client as RedisClient
from tests.sim.fake_redis import Master
from tests.sim.faults import Faults
from tests.sim.handlers import HANDLERS
from tests.sim.invariants import Ledger, Violation
from tests.sim.loop import EPOCH, PROCESS, OutOfSteps, SimLoop, Stuck
from tests.sim.network import Killed, Network
from tests.sim.patches import MESSAGE, patched
from tests.sim.plan import ACTION_KINDS, Plan, behaviour
from tests.sim.postgres import Server
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.event import ids as event_id
from webhook_ingest.shared.event.message import EventMessage, to_amqp
from webhook_ingest.shared.replays import keys as replay_keys
from webhook_ingest.shared.settings import WORKER_CONNECTIONS
from webhook_ingest.shared.sources import routes as route_rules
from webhook_ingest.shared.sources.model import parse_source
from webhook_ingest.workers.handlers import PermanentError
from webhook_ingest.workers.worker import Worker

ROUTED = "fan"  # a source with routes: each event fans out to one run per route (workers/fan_out.py)
ROUTES = {"call": "ext", "write": "db"}  # route -> the source whose handler it runs
SETTLE_LIMIT = 900.0  # virtual seconds after the plan's end for everything to settle
NAMESPACE = "sim"
STEP_LIMIT = 5_000_000  # steps in one run: past it, a livelock
_LOGGED = {
    "event_deferred": ("reason",),
    "event_processed": ("outcome",),
    "processing_lock_lost": ("holder", "lost"),
    "attempt_already_handed_on": (),
    "completion_refused_stale_token": (),
    "processing_crashed": ("exc_info",),
    "batch_crashed": ("exc_info",),
    "event_retry_scheduled": ("retry_in",),
    "event_dead_lettered": (),
    "service_outage": ("service",),
    "service_recovered": ("service",),
    "handlers_cancelled_at_grace_end": ("count",),
    "lease_lost_handler_cancelled": ("holder", "lost"),
    "ack_failed": ("frame",),
    "statement_sent_again": ("error",),
    "incident_count_skipped": ("error",),
}


@dataclass
class Process:
    name: str
    slot: int
    worker: Worker
    connection: Connection | None = None
    task: asyncio.Task | None = None
    dead: bool = False
    stopping: bool = False  # SIGTERM: its exit restarts it


@dataclass
class Result:
    plan: Plan
    violations: list[Violation]
    steps: int
    virtual_seconds: float
    wall_seconds: float
    trace: list[tuple]
    stats: dict = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        """A violation not already on record (`tests.sim.known`)."""
        return any(not violation.known for violation in self.violations)


class Simulation:
    def __init__(self, plan: Plan, strict_attempts: bool = False):
        self.plan = plan
        self.rng = random.Random(plan.scheduler_seed)
        self.loop = SimLoop(self.rng, max_steps=STEP_LIMIT)
        self.net = Network(self.rng)
        self.ledger = Ledger(strict_attempts, faulty=bool(plan.faults))
        self.ledger.excuse = self._repeat_excused
        self.namespace = NAMESPACE
        self.broker = Broker(self)
        self.server = Server(self)
        self.masters = [Master() for _ in range(plan.config.redis_masters)]
        self.faults = Faults(self)
        self.processes: dict[str, Process] = {}
        self.slots: list[Process | None] = [None] * plan.config.workers
        self.keys = {key for send in plan.sends for key in _keys_of(send.source, send.event)}
        self.variants: dict[tuple[str, str], tuple[int, int]] = {}  # (key, payload hash) -> (event, variant)
        self.trace: list[tuple] = []
        self.sources = {
            name: parse_source(
                name,
                {
                    "scheme": "hmac-sha256",
                    "secrets": ["s"],
                    "handler": handler,
                    "max_attempts": plan.config.max_attempts,
                    "retry_delays": list(plan.config.retry_delays),
                },
            )
            for name, handler in HANDLERS.items()
        }
        self.sources[ROUTED] = parse_source(
            ROUTED,
            {
                "scheme": "hmac-sha256",
                "secrets": ["s"],
                "max_attempts": plan.config.max_attempts,
                "retry_delays": list(plan.config.retry_delays),
                "routes": [{"name": route, "handler": HANDLERS[source]} for route, source in ROUTES.items()],
            },
        )
        self._restarts = 0
        self.event_replay_ids = itertools.count(1)
        self._starts = 0
        self._planned = len(plan.sends) + len(plan.steps)  # not happened yet
        self.pauses: list[tuple[str, float, float]] = []  # process, from, seconds
        self.lags: list[tuple[str, float]] = []  # process, until

    # -- running ----------------------------------------------------------------

    def run(self) -> Result:
        started = time.perf_counter()
        asyncio.set_event_loop(self.loop)
        try:
            with patched(self):
                try:
                    self.loop.run_until_complete(self._main())
                except Stuck:
                    self.violation(
                        "stuck",
                        "",
                        "nothing is ready and no timer is set, but the run has not ended: " + self._waiting(),
                    )
                except OutOfSteps:
                    self.violation(
                        "livelock", "", f"{STEP_LIMIT} steps without ending (virtual {self.loop.time():.1f} s)"
                    )
                finally:
                    self._close_loop()
        finally:
            asyncio.set_event_loop(None)
        return Result(
            self.plan,
            list(self.ledger.violations),
            self.loop.steps,
            self.loop.time(),
            time.perf_counter() - started,
            self.trace,
            self._stats(),
        )

    async def _main(self) -> None:
        self.broker.declare(topology.dead_queue(NAMESPACE), {})
        self.broker.declare(topology.events_queue(NAMESPACE), operators.events_queue_arguments(self))
        for slot in range(self.plan.config.workers):
            self.start(slot)
        for send in self.plan.sends:
            self.loop.call_at(send.at, self._send, send)
        for step in self.plan.steps:
            self.loop.call_at(step.at, self._do, step)
        await asyncio.sleep(self.plan.horizon)
        if await self._settled():
            await self._stop_everything()
            self._final_checks()

    async def _settled(self) -> bool:
        deadline = self.loop.time() + SETTLE_LIMIT
        while not self._quiet():
            if self.loop.time() > deadline:
                self.violation("stuck", "", f"not quiet {SETTLE_LIMIT:.0f} s after the plan's end: " + self._waiting())
                return False
            await asyncio.sleep(0.5)
        return True

    def _quiet(self) -> bool:
        if self._planned or self._restarts or not self.broker.empty():
            return False
        return all(not p.worker._in_flight and not p.worker._pending for p in self.live())

    async def _stop_everything(self) -> None:
        self.net.disarm()  # a crash still armed must not strike the shutdown that ends the run
        for process in self.live():
            process.worker.stop()
        tasks = [p.task for p in self.live() if p.task is not None]
        await asyncio.wait(tasks, timeout=self.plan.config.grace_seconds + 60)

    def _close_loop(self) -> None:
        """Ends every task still there (their processes count as killed), then the loop."""
        self.net.dead |= set(self.processes)
        self.loop.max_steps = None
        tasks = list(asyncio.all_tasks(self.loop))
        for task in tasks:
            task.cancel()
        try:
            self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        except Stuck:
            pass
        self.loop.close()

    # -- processes ---------------------------------------------------------------

    def start(self, slot: int) -> Process:
        self._starts += 1
        name = f"w{slot}" if self._starts <= self.plan.config.workers else f"w{slot}.{self._starts}"
        settings = SimpleNamespace(
            namespace=NAMESPACE,
            delivery_limit=self.plan.config.delivery_limit,
            lock_ttl=self.plan.config.lock_ttl,
            done_ttl=self.plan.config.done_ttl,
            redis_urls=tuple(f"redis://sim-{i}" for i in range(len(self.masters))),
            amqp_url="amqp://sim/",
            database_url="postgresql://sim/",
            worker_connections=WORKER_CONNECTIONS,
        )  # the pools a default worker has
        worker = Worker(
            settings,
            self.sources,
            concurrency=self.plan.config.concurrency,  # type: ignore[arg-type]
            grace_seconds=self.plan.config.grace_seconds,
            name=name,
        )

        async def side_tasks() -> list:
            """Of the worker's own, the incident counts' writer (where the
            worker has one); the poison drainer is the simulation's."""
            counts = getattr(worker, "incident_counts", None)
            return [] if counts is None else [asyncio.create_task(counts.run(), name="incident-counts")]

        worker._start_side_tasks = side_tasks  # type: ignore[method-assign]
        process = Process(name, slot, worker)
        self.processes[name] = process
        self.slots[slot] = process
        context = contextvars.copy_context()
        context.run(PROCESS.set, name)
        process.task = self.loop.create_task(self._live(process), context=context)
        self.note("sim", "started", None, name)
        return process

    async def _live(self, process: Process) -> None:
        try:
            await process.worker.run()
        except (Killed, asyncio.CancelledError):
            pass
        except Exception as exc:  # noqa: BLE001 - a worker that dies of our own code is a finding
            self.violation("crash", "", f"{process.name} died: {exc!r}")
        finally:
            self._exit(process)

    def _exit(self, process: Process) -> None:
        if process.dead:
            return
        process.dead = True
        self.net.dead.add(process.name)
        if process.connection is not None:
            process.connection.kill()  # its unacked deliveries go back to the queue
        self.ledger.process_died(process.name)
        self.note("sim", "exited", None, process.name)

    def kill(self, slot: int, restart_after: float) -> None:
        process = self.slots[slot]
        if process is None or process.dead:
            return
        self.note("sim", "SIGKILL", None, process.name)
        self.loop.unpause(process.name)  # its tasks must see their cancellation
        self._exit(process)
        for task in self.loop.tasks_of(process.name):
            task.cancel()
        if not process.stopping:
            self._restart(slot, restart_after)

    def stop(self, slot: int, restart_after: float) -> None:
        process = self.slots[slot]
        if process is None or process.dead or process.stopping:
            return
        self.note("sim", "SIGTERM", None, process.name)
        process.stopping = True
        process.worker.stop()
        assert process.task is not None
        self._restarts += 1
        process.task.add_done_callback(lambda _: self._restart(slot, restart_after, counted=True))

    def _restart(self, slot: int, after: float, counted: bool = False) -> None:
        if not counted:
            self._restarts += 1

        def again() -> None:
            self._restarts -= 1
            self.start(slot)

        self.loop.call_later(after, again)

    def pause(self, process: Process, seconds: float) -> None:
        self.note("sim", "paused", None, f"{process.name} for {seconds:.3f}s")
        self.pauses.append((process.name, self.loop.time(), seconds))
        self.loop.pause(process.name, seconds)

    def _known_overlap(self, other) -> str:
        """An overlap with a run whose process was paused past the lease's
        margin since it started: the limit docs/design.md, "Exclusion", names."""
        margin = self.plan.config.lock_ttl / 3
        if any(
            name == other.process and at + seconds > other.started and seconds >= margin
            for name, at, seconds in self.pauses
        ):
            return "pause past the margin"
        if any(name == other.process and until > other.started for name, until in self.lags):
            return "a lagging loop (a pause in slow motion)"
        return ""

    def _repeat_excused(self, key: str, earlier, at: float) -> str:
        """Why a run of `key` may repeat `earlier` (a run that did not fail
        on its own) at `at`, or "" (`Ledger`, "A run repeated only for a reason")."""
        process = self.processes.get(earlier.process)
        if process is None or process.dead:
            return "its process exited"
        let_go = [
            when for when, by in self.server.releases.get(key, []) if by == earlier.process and when > earlier.started
        ]
        if any(
            taker != earlier.process and earlier.started < taken <= at and not any(when < taken for when in let_go)
            for taken, taker in self.server.takes.get(key, [])
        ):
            return "another worker took the key's lease before its holder let it go"
        if self.faults.pg_away(process.slot, earlier.started, at):
            return "Postgres was away from its process"
        replayed = replay_keys.parse(key)
        batchable = (replayed[1] if replayed else key).split(":", 1)[0] == "inbox"  # a replay's run too
        if batchable and earlier.rolled_back:
            return "its batch rolled back"
        return ""

    def connect(self) -> Connection:
        process = self.processes[PROCESS.get() or ""]
        process.connection = Connection(self.broker, process.name)
        return process.connection

    def redis_client(self, url: str) -> RedisClient:
        return RedisClient(self, self.masters[int(url.rsplit("-", 1)[1])])

    def live(self) -> list[Process]:
        return [p for p in self.slots if p is not None and not p.dead]

    def in_slot(self, slot: int) -> Process | None:
        process = self.slots[slot]
        return None if process is None or process.dead else process

    def slot(self) -> int | None:
        process = self.processes.get(PROCESS.get() or "")
        return None if process is None else process.slot

    # -- the world ---------------------------------------------------------------

    def _send(self, send) -> None:
        self._planned -= 1
        key = _key(send.source, send.event)
        payload = {"id": f"e{send.event}", "type": "sim", "variant": send.variant}
        sha = event_id.payload_sha256(payload)
        event = EventMessage(
            key=key,
            source=send.source,
            event_id=f"e{send.event}",
            payload_sha256=sha,
            received_at=EPOCH + self.loop.time(),
            body=orjson.dumps(payload),
        )
        for one in _keys_of(send.source, send.event):  # a routed event: each route's run is an event to settle
            self.variants[(one, sha)] = (send.event, send.variant)
            self.ledger.accepted.add((one, sha))
        self.note("ingress", "accepted", key, f"payload {sha[:8]}")
        self.publish(to_amqp(event))

    def publish_replay(self, key: str, sha: str, replay_id: int) -> None:
        """Replay `replay_id` of the event keyed `key` (payload `sha`), under its own key."""
        number, variant = self.variants[(key, sha)]
        source = key.split(":", 1)[0]
        replayed = replay_keys.replay_key(key, replay_id)
        payload = {"id": f"e{number}", "type": "sim", "variant": variant}
        for one in [replayed] + (
            [route_rules.route_key(replayed, route) for route in ROUTES] if source == ROUTED else []
        ):
            self.keys.add(one)
            self.variants[(one, sha)] = (number, variant)
            self.ledger.accepted.add((one, sha))
        self.publish(
            to_amqp(
                EventMessage(
                    key=replayed,
                    source=source,
                    event_id=f"e{number}",
                    payload_sha256=sha,
                    received_at=EPOCH + self.loop.time(),
                    body=orjson.dumps(payload),
                )
            )
        )

    def publish(self, message) -> None:
        self.broker.route(
            Envelope(message.body, dict(message.headers), message.message_id), topology.events_queue(NAMESPACE)
        )

    def _do(self, step) -> None:
        self._planned -= 1
        self.note("plan", step.kind, None, f"target {step.target} for {step.duration}s ({step.detail})")
        match step.kind:
            case "replay":
                operators.replay(self)
            case "bulk_replay":
                operators.bulk_replay(self)
            case "event_replay":
                operators.event_replay(self)
            case "discard":
                operators.discard(self)
            case "prune":
                self.loop.create_task(operators.prune(self, step.detail))
            case _:
                assert step.kind not in ACTION_KINDS
                fault_steps.apply(self, step)

    def drain_dead(self, envelope: Envelope) -> None:
        self.loop.create_task(operators.drain_dead(self, envelope))

    async def handle(self, event, ctx, writes: bool) -> None:
        """A handler run (`tests.sim.handlers`): recorded, then what the plan says it does."""
        message = MESSAGE.get()
        replay_of = message.replay_of if message is not None else 0
        sha = message.payload_sha256 if message is not None else ""
        number, variant = self.variants.get((event.key, sha), (0, 0))
        does = behaviour(self.plan, number, variant, replay_of, event.attempt)
        process = PROCESS.get() or "?"
        batchable = getattr(self.sources[event.source], "handler", "") == HANDLERS["inbox"]
        run = self.ledger.run_started(
            process,
            event.key,
            (sha[:8], replay_of, event.attempt),
            self.loop.time(),
            allowed=2 if batchable else 1,
            known=known.rerun(self.server.store, event.key, sha, replay_of, event.attempt),
            known_overlap=self._known_overlap,
        )
        self.note("handler", "start", event.key, f"attempt {event.attempt} chain {replay_of} for {does.seconds:.3f}s")
        self.server.run_in(getattr(ctx, "db", None), run)
        try:
            if writes and does.writes_first:
                try:
                    await ctx.db.execute("INSERT INTO sim_effects (key) VALUES ($1)", event.key)
                except Exception:  # its transaction refused (TurnTaken: another run holds the turn), before
                    run.did_nothing = True  # any call went out; a cancellation by its own worker is no refusal
                    raise
            self.net.check_alive()
            await asyncio.sleep(does.seconds)  # the outside world
            self.net.check_alive()
            if writes and not does.writes_first:
                await ctx.db.execute("INSERT INTO sim_effects (key) VALUES ($1)", event.key)
            if does.fails == "permanent":
                run.failed = True
                raise PermanentError("sim: refused for good")
            if does.fails == "retry":
                run.failed = True
                raise RuntimeError("sim: the downstream answered 500")
        finally:
            self.ledger.run_ended(event.key, run, self.loop.time())
            self.note("handler", "end", event.key, f"attempt {event.attempt}")

    # -- the ledger's view ---------------------------------------------------------

    def released(self, key: str, sha: str, why: str) -> None:
        self.ledger.check_settled(
            key, sha, self.broker.carriers[(key, sha)], self.settled(key, sha), self.loop.time(), why
        )

    def settled(self, key: str, sha: str) -> bool:
        base = replay_keys.parse(key)
        if (base[1] if base else key).startswith(f"{ROUTED}:") and route_rules.SEPARATOR not in key:
            return all(
                self.broker.carriers[(one, sha)] > 0 or self.settled(one, sha)  # settled once fanned out
                for one in (route_rules.route_key(key, route) for route in ROUTES)
            )
        store = self.server.store
        completion = store.completions.get(key)
        if completion is not None and completion.payload_sha256 == sha:
            return True
        if (key, sha) in self.ledger.ever_completed or (key, sha) in self.ledger.discarded:
            return True
        if (key, sha) in store.open_dead_letters:
            return True
        return any(conflict[0] == key and conflict[2] == sha for conflict in store.conflicts)

    def _final_checks(self) -> None:
        for key, sha in sorted(self.ledger.accepted):
            if not self.settled(key, sha):
                self.violation(
                    "lost",
                    key,
                    f"payload {sha[:8]} accepted, and at the end neither completed, a "
                    "conflict, a dead letter nor discarded",
                )
        for key, runs in sorted(self.ledger.active.items()):
            for run in runs:
                self.violation("stuck", key, f"a run of {run.process} never ended")
        if not self.broker.empty():
            self.violation("stuck", "", "messages left in the broker: " + self._waiting())

    def violation(self, kind: str, key: str, detail: str) -> None:
        self.ledger.violate(kind, key, detail, self.loop.time())

    def _waiting(self) -> str:
        held = {f"{key}/{sha[:8]}": n for (key, sha), n in self.broker.carriers.items() if n}
        busy = {p.name: len(p.worker._in_flight) for p in self.live() if p.worker._in_flight}
        return f"carriers {dict(list(held.items())[:10])} ({len(held)} events), busy workers {busy}"

    # -- the trace -----------------------------------------------------------------

    def note(self, service: str, what: str, key: str | None, detail: str = "") -> None:
        self.trace.append((round(self.loop.time(), 6), PROCESS.get() or "-", service, what, key or "", detail))

    def logged(self, event: dict) -> None:
        name = event.get("event", "")
        if name in ("processing_crashed", "batch_crashed"):
            error = sys.exc_info()[1]
            self.violation(
                "crash", str(event.get("key", "")), f"{name} in our own code (a bug, not the handler): {error!r}"
            )
        if name in _LOGGED:
            detail = " ".join(f"{field}={event[field]}" for field in _LOGGED[name] if field in event)
            self.note("log", name, event.get("key"), detail)

    def _stats(self) -> dict:
        store = self.server.store
        return {
            "events": len(self.ledger.accepted),
            "runs": sum(self.ledger.runs.values()),
            "completed": len(store.completions),
            "dead_letters": len(self.server.dead_letters),
            "processes": len(self.processes),
            "faults": len(self.plan.faults),
            "deadlocks": self.server.deadlocks,
        }


def _key(source: str, event: int) -> str:
    return f"{source}:e{event}"


def _keys_of(source: str, event: int) -> list[str]:
    """The event's key, then its routes' (a routed source's: `ROUTES`)."""
    key = _key(source, event)
    return [key] + ([route_rules.route_key(key, route) for route in ROUTES] if source == ROUTED else [])
