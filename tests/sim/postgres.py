"""Postgres as the workers see it: the in-memory store made a server with
sessions, pools, latency, faults and row locks.

The store is the one the processor's unit tests use
(`tests/support/in_memory.py`: fences, turns, completions, conflicts, the
attempt records, with rollback). Each process talks to it through a
`Client`, which stands for `CompletionStore` on that process's pools and
wraps *every* coroutine method generically — so a method added to the
store is simulated without a change here:

- a method with a session argument runs on that session (in the
  handler's transaction, or the lease's statement before it); any other
  takes a connection of the process's bounded pool for the call (lease
  renewals: of the renewals pool), and waits for one like asyncpg's pool;
- each call is a request and a reply, each with a seeded latency; a
  fault can stall either (a partition, a stalled server: until the fault
  ends or the statement's own time limit, then TimeoutError and the
  session closed), or fail either with the session lost — before the
  statement ran, or after it did (its reply lost);
- a method whose contract is not to raise keeps it: `release_leases`
  swallows the failure, `record_handed_on` tries again until it commits
  (as `workers/claim/completions.py` does).

Deadlocks: a statement that locks several fence rows (`LOCKS`) locks them
one at a time, as the real SQL does — in key order if its text sorts them
first (`_sorts_keys`), else in any order (the plan's, seeded) — and holds
them until it ends (autocommit) or its transaction does. A wait that
closes a cycle of waits is a violation ("deadlock": issue 35, item 3, one
lock order), and Postgres's detector ends one waiter of the cycle with
DeadlockDetectedError after `DEADLOCK_TIMEOUT`, unless a statement's own
time limit ends one first; a store method whose real code sends its
statement again on a lock conflict (`resends_on_conflict`) goes through
that real code.

Row locks: a store statement that wrote a key's rows (its fence, its
completion) inside a transaction holds them until the transaction ends,
and any other session's store statement naming that key waits, as an
UPDATE or INSERT … ON CONFLICT on a locked row does (a handler's own rows
are another table: they lock nothing here). The in-memory store has no snapshots, so reads wait too instead
of seeing the older version: a reader never sees uncommitted writes (what
matters), at the cost of never reading the old version during that window.

The handler's own writes through `ctx.db` are rows of a `sim_effects`
table (`Session.execute`), undone with their transaction; what commits is
counted per key (`Ledger.effects_committed`). Dead letters are rows here
too, with the statement `shared/dead_letters/model.record_dead_letter` makes.
"""

import asyncio
import contextlib
import functools
import inspect
import re
from collections import Counter, defaultdict
from dataclasses import dataclass
from itertools import count

import asyncpg

from tests.sim.loop import PROCESS
from tests.sim.network import Killed
from tests.support import in_memory
from webhook_ingest.shared.backoff import pauses
from webhook_ingest.shared.event.message import EventMessage
from webhook_ingest.shared.incidents import store as incident_store
from webhook_ingest.workers.claim import completions
from webhook_ingest.workers.claim.lease import Lease

SWALLOWS = {"release_leases"}  # best effort: a lease not released runs out by itself
RETRIES = {"record_handed_on"}  # returns only once committed, waiting while Postgres is away
# Which of the process's pools a method takes a connection from (the others: "statements"),
# as `CompletionStore` does; before its three pools, the one pool stands for all three.
POOLS = {"session": "transactions", "extend_leases": "renewals"}
TIMEOUTS = {
    "take_leases": 5.0,
    "check_completed": 5.0,
    "complete_alone": 5.0,
    "release_leases": 5.0,
    "record_handed_on": 10.0,
    "completed_sha256": 5.0,
    "settled_before": 5.0,
    "probe_writable": 2.0,
    "record_dead_letter": 10.0,
}
DEFAULT_TIMEOUT = 5.0  # a statement of ours outside the handler's transaction (STATEMENT_SECONDS)
# The store's statements that lock key_fences rows, by the name of their SQL in
# workers/queries.sql (whose text says in which order they lock them: `_sorts_keys`).
LOCKS = {
    "take_leases": "take_leases",
    "extend_leases": "extend_leases",
    "release_leases": "release_leases",
    "record_handed_on": "record_handed_on",
    "complete_event": "complete_event",
    "complete_events": "complete_events",
    "complete_alone": "complete_events",
}
ROW_SECONDS = 0.0002  # the time a statement takes from one row it locks to the next
DEADLOCK_TIMEOUT = 1.0  # Postgres's deadlock_timeout: how long a wait lasts before it looks for a cycle


def _seconds(setting: str) -> float:
    """A Postgres duration setting ("200ms", "2s") in seconds."""
    number = float(re.sub(r"[a-z]+$", "", setting))
    return number / 1000 if setting.endswith("ms") else number


def _sorts_keys(sql_name: str) -> bool:
    """Whether the real statement locks its rows in key order: it sorts
    them by key before it locks them (a SELECT ... ORDER BY key FOR UPDATE,
    or INSERT ... SELECT ... ORDER BY key ... ON CONFLICT DO UPDATE)."""
    return re.search(r"ORDER BY (key_fences\.)?key\b", completions.SQL[sql_name]) is not None


@functools.cache
def resends_on_conflict(name: str) -> bool:
    """Whether the real `CompletionStore.<name>` sends its statement again
    when Postgres ends it for a lock conflict (`_fetch_again_on_conflict`)."""
    method = getattr(completions.CompletionStore, name, None)
    helper = getattr(completions, "_fetch_again_on_conflict", None)
    return method is not None and helper is not None and helper.__name__ in inspect.getsource(method)


class _Statement:
    """An autocommit statement: what holds its rows until it ends."""

    def __init__(self, name: str) -> None:
        self.name = name


class _Resent:
    """The connection `completions._fetch_again_on_conflict` sends on: its
    `fetch` runs the simulated statement again, so the real code decides
    what a lock conflict does."""

    def __init__(self, send) -> None:
        self._send = send

    async def fetch(self, query: str, *args, timeout: float | None = None):
        return await self._send()


def session_lost() -> asyncpg.exceptions.ConnectionDoesNotExistError:
    return asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation")


class Connection:
    """A pooled connection handed to code that runs SQL of its own (the
    dead-letter insert, the incident counts). Its transaction holds the
    rows its statements lock (an incident's) until it ends."""

    name = "a transaction"

    def __init__(self, server: "Server | None" = None) -> None:
        self.closed = False
        self.in_transaction = False
        self._server = server

    def is_closed(self) -> bool:
        return self.closed

    def terminate(self) -> None:
        self.closed = True

    @contextlib.asynccontextmanager
    async def transaction(self):
        self.in_transaction = True
        try:
            yield
        finally:
            self.in_transaction = False
            if self._server is not None:
                self._server.let_go(self)


class Pool:
    """asyncpg.Pool's acquire: at most `size` at once, the others wait in turn."""

    def __init__(self, loop, size: int, server: "Server | None" = None):
        self._loop, self.size, self._free = loop, size, size
        self._server = server
        self._waiters: list[asyncio.Future] = []
        self.peak = 0

    @contextlib.asynccontextmanager
    async def acquire(self, timeout: float | None = None):
        await self._take(timeout)
        self.peak = max(self.peak, self.size - self._free)
        try:
            yield Connection(self._server)
        finally:
            self._give()

    async def _take(self, timeout: float | None) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        granted = self._loop.create_future()
        self._waiters.append(granted)
        try:
            async with asyncio.timeout(timeout):
                await granted
        except BaseException:
            if granted.done() and not granted.cancelled():
                self._give()  # granted as we left: pass it on
            else:
                granted.cancel()
                if granted in self._waiters:  # else passed over already, as a cancelled waiter
                    self._waiters.remove(granted)
            raise

    def _give(self) -> None:
        while self._waiters:
            waiter = self._waiters.pop(0)
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1

    async def close(self) -> None:
        pass

    def terminate(self) -> None:
        pass

    async def expire_connections(self) -> None:
        pass


@dataclass(eq=False)
class Effect:
    """A row a handler wrote through ctx.db."""

    key: str
    epoch: int
    committed: bool = False


@dataclass(eq=False)
class DeadLetter:
    id: int
    event: EventMessage
    status: str = "dead"


class SimSession(in_memory.Session):
    """The in-memory session, whose `execute` (what a handler sends through
    ctx.db) writes a `sim_effects` row on the simulated server."""

    server: "Server | None" = None

    async def execute(self, query: str, *args: object) -> str:
        assert SimSession.server is not None
        return await SimSession.server.handler_write(self, str(args[0]))


class Server:
    def __init__(self, sim):
        self.sim = sim
        self.store = in_memory.InMemoryCompletions()
        self.effects: dict[str, list[Effect]] = defaultdict(list)
        self.dead_letters: dict[int, DeadLetter] = {}
        self.replay_ids = count(1)
        self._dead_letter_ids = count(1)
        self._row_locks: dict[str, object] = {}  # key -> the transaction (a session) or statement holding its row
        self._locks_of: dict[object, set[str]] = defaultdict(set)
        self._ended: dict[object, asyncio.Event] = {}  # set when the holder lets its rows go
        self._waits_for: dict[object, object] = {}  # a waiting holder -> the holder it waits for
        self.deadlocks = 0
        self.incidents: Counter = Counter()  # an incident's row -> failures counted in it
        self.takes: dict[str, list[tuple[float, str]]] = defaultdict(list)  # key -> (when, process) its lease was taken
        self.releases: dict[str, list[tuple[float, str]]] = defaultdict(list)  # key -> (when, process) it let it go
        self._runs_in: dict[in_memory.Session, list] = {}  # a transaction -> the handler runs in it
        self._pending: dict[in_memory.Session, list[Effect]] = defaultdict(list)

    # -- one statement ----------------------------------------------------------

    async def statement(self, name: str, run, args: tuple, session: in_memory.Session | None, timeout: float | None):
        try:
            async with asyncio.timeout(timeout):
                return await self._statement(name, run, self._keys(args), session)
        except TimeoutError:
            if session is not None:
                session.terminate()  # closed_if_left_by: the session is closed, not cancelled
            self.sim.note("pg", "timed out", None, name)
            raise

    async def _statement(self, name: str, run, keys: set[str], session: in_memory.Session | None):
        in_transaction = session is not None and session.undo is not None
        holder: object = session if in_transaction else _Statement(name)
        locks = LOCKS.get(name)
        taken: list[str] = []
        try:
            if locks is None:
                await self._wait_for_rows(keys, holder)
            await self.sim.net.hop("pg")
            await self._through(session)
            if locks is not None:  # on the server, as the statement reaches each row
                taken = await self._lock_in_order(name, self._lock_order(locks, keys), holder)
            written = len(session.undo) if in_transaction and session is not None and session.undo is not None else None
            result = await run()
            if written is not None and session is not None and session.undo is not None and len(session.undo) > written:
                self._lock_rows(keys, session)  # held until the transaction ends
                taken = []
            self._let_go(holder, taken)  # an autocommit statement commits before it answers
            await self._through(session)
            await self.sim.net.hop("pg")
            return result
        finally:
            self._let_go(holder, taken)

    def _let_go(self, holder: object, taken: list[str]) -> None:
        if isinstance(holder, _Statement):
            self._unlock(holder)
        else:
            self._unlock_rows(taken, holder)
        taken.clear()

    def _lock_order(self, sql_name: str, keys: set[str]) -> list[str]:
        """The order the real statement locks its fence rows in: key order
        if its SQL sorts them first (`ORDER BY key ... FOR UPDATE`, or an
        INSERT ... SELECT ... ORDER BY key), else the join's, which is
        the plan's: any order (seeded)."""
        ordered = sorted(keys)
        if len(ordered) > 1 and not _sorts_keys(sql_name):
            self.sim.rng.shuffle(ordered)
        return ordered

    async def _lock_in_order(self, name: str, order: list[str], holder: object) -> list[str]:
        """Each row in turn, as Postgres locks them; waits for one another
        session holds. A wait that closes a cycle of waits is a deadlock:
        after `DEADLOCK_TIMEOUT` the waiter that finds it is ended with
        DeadlockDetectedError, its statement's locks let go, as Postgres does."""
        taken: list[str] = []
        try:
            for position, key in enumerate(order):
                while (owner := self._row_locks.get(key, holder)) is not holder:
                    await self._wait(name, key, holder, owner)
                if key not in self._locks_of.get(holder, ()):
                    self._row_locks[key] = holder
                    self._locks_of[holder].add(key)
                    taken.append(key)
                if position + 1 < len(order):
                    await asyncio.sleep(ROW_SECONDS)  # others run meanwhile, and may lock the next row
        except BaseException:
            self._unlock_rows(taken, holder)
            raise
        return taken

    async def _wait(
        self, name: str, key: str, holder: object, owner: object, lock_timeout: float | None = None
    ) -> None:
        """Until `owner` lets its rows go; Postgres's deadlock check once
        `DEADLOCK_TIMEOUT` into the wait, and LockNotAvailableError past the
        statement's `lock_timeout`, if it set one."""
        self._waits_for[holder] = owner
        if self._in_cycle(holder):
            self.sim.violation(
                "deadlock", key, f"{name} waits for {self._cycle(holder)}: statements lock rows in different orders"
            )
        ended = self._ended.setdefault(owner, asyncio.Event())
        started, checked = self.sim.loop.time(), False
        try:
            while not ended.is_set():
                limits = ([] if checked else [started + DEADLOCK_TIMEOUT]) + (
                    [] if lock_timeout is None else [started + lock_timeout]
                )
                if not limits:
                    await ended.wait()
                    return
                try:
                    async with asyncio.timeout_at(min(limits)):
                        await ended.wait()
                        return
                except TimeoutError:
                    now = self.sim.loop.time()
                    if not checked and now >= started + DEADLOCK_TIMEOUT:
                        checked = True
                        if self._in_cycle(holder):
                            self.deadlocks += 1
                            self.sim.note("pg", "deadlock", key, f"{name} ended as the victim")
                            raise asyncpg.exceptions.DeadlockDetectedError("deadlock detected") from None
                    if lock_timeout is not None and now >= started + lock_timeout:
                        self.sim.note("pg", "lock timeout", key, name)
                        raise asyncpg.exceptions.LockNotAvailableError(
                            "canceling statement due to lock timeout"
                        ) from None
        finally:
            self._waits_for.pop(holder, None)

    def _cycle(self, holder: object) -> str:
        names: list[str] = []
        waiter = self._waits_for.get(holder)
        while waiter is not None and waiter is not holder and len(names) < 10:
            names.append(getattr(waiter, "name", "a transaction"))
            waiter = self._waits_for.get(waiter)
        return ", which waits for ".join(names) + ", which waits for it"

    def _in_cycle(self, holder: object) -> bool:
        seen, waiter = set(), self._waits_for.get(holder)
        while waiter is not None and waiter not in seen:
            if waiter is holder:
                return True
            seen.add(waiter)
            waiter = self._waits_for.get(waiter)
        return False

    async def _through(self, session: in_memory.Session | None) -> None:
        """Waits while the calling process's path to Postgres is stalled; fails while Postgres is down."""
        faults = self.sim.faults
        while (until := faults.pg_stalled_until(self.sim.slot())) is not None:  # noqa: ASYNC110 - a window a later fault may extend
            await asyncio.sleep(until - self.sim.loop.time())
        if faults.pg_fails():
            if session is not None:
                session.terminate()
            raise session_lost()

    def _keys(self, args) -> set[str]:
        keys: set[str] = set()
        for arg in args:
            if isinstance(arg, str) and arg in self.sim.keys:
                keys.add(arg)
            elif isinstance(arg, (EventMessage, Lease)):
                keys.add(arg.key)
            elif isinstance(arg, (list, tuple, set)):
                keys |= self._keys(arg)
        return keys

    async def _wait_for_rows(self, keys: set[str], holder: object) -> None:
        """A statement that locks no fence row (a read) waits while
        another holds one of its keys' rows (see the module's docstring)."""
        while True:
            owner = next(
                (self._row_locks[k] for k in sorted(keys) if self._row_locks.get(k, holder) is not holder), None
            )
            if owner is None:
                return
            await self._ended.setdefault(owner, asyncio.Event()).wait()

    def _lock_rows(self, keys: set[str], session: in_memory.Session) -> None:
        for key in keys:
            self._row_locks[key] = session
        self._locks_of[session] |= keys

    def _unlock_rows(self, keys: list[str], holder: object) -> None:
        held = self._locks_of.get(holder)
        for key in keys:
            if self._row_locks.get(key) is holder:
                del self._row_locks[key]
            if held is not None:
                held.discard(key)
        if keys:
            self._wake(holder)

    def _unlock(self, holder: object) -> None:
        for key in self._locks_of.pop(holder, set()):
            if self._row_locks.get(key) is holder:
                del self._row_locks[key]
        self._wake(holder)

    def _wake(self, holder: object) -> None:
        ended = self._ended.pop(holder, None)
        if ended is not None:
            ended.set()

    def let_go(self, holder: object) -> None:
        """A pooled connection's transaction ended: its rows are free."""
        self._unlock(holder)

    def transaction_ended(self, session: in_memory.Session, committed: bool) -> None:
        self._unlock(session)
        for run in self._runs_in.pop(session, []):
            run.rolled_back = not committed
        for effect in self._pending.pop(session, []):
            if committed:
                effect.committed = True
                self._count_effects(effect.key)

    def run_in(self, session, run) -> None:
        """A handler run in `session`'s transaction: told whether it rolled back."""
        if isinstance(session, in_memory.Session) and session.undo is not None:
            self._runs_in.setdefault(session, []).append(run)

    def leases_released(self, leases) -> None:
        process = PROCESS.get() or "?"
        for lease in leases:
            self.releases[lease.key].append((self.sim.loop.time(), process))

    def leases_taken(self, granted) -> None:
        process = PROCESS.get() or "?"
        for key in granted or ():
            self.takes[key].append((self.sim.loop.time(), process))

    # -- the handler's writes -----------------------------------------------------

    async def handler_write(self, session: in_memory.Session, key: str) -> str:
        async def write() -> str:
            effect = Effect(key, self.sim.ledger.epochs[key])
            self.effects[key].append(effect)
            if session.undo is None:  # autocommit
                effect.committed = True
                self._count_effects(key)
            else:
                session.undo.append(lambda: self.effects[key].remove(effect))
                self._pending[session].append(effect)
            return "INSERT 0 1"

        self.sim.note("pg", "ctx.db write", key, "in a transaction" if session.undo is not None else "autocommit")
        return await self.statement("ctx.db", write, (), session, None)  # its own table: no fence row locked

    def _count_effects(self, key: str) -> None:
        epoch = self.sim.ledger.epochs[key]
        committed = sum(1 for effect in self.effects[key] if effect.committed and effect.epoch == epoch)
        self.sim.ledger.effects_committed(key, committed, self.sim.loop.time())

    # -- dead letters -------------------------------------------------------------

    async def record_dead_letter(self, connection, event: EventMessage, errors, timeout: float | None = None):
        """shared/dead_letters/model.record_dead_letter: one open dead letter per
        event, none for an event completed with this payload."""

        async def insert() -> int | None:
            return self.insert_dead_letter(event)

        return await self.statement("record_dead_letter", insert, (event,), None, timeout)

    async def record_failure(self, connection, failure, timeout: float | None = None) -> int:
        """shared/incidents/store.record_failure: the failure counted in its
        incident's row (one per source, handler and error type), locked until
        the caller's transaction ends, waiting for it at most
        INCIDENT_LOCK_TIMEOUT (its `SET LOCAL lock_timeout`)."""
        row = f"incident:{failure.source}/{failure.handler}/{failure.error_type}"
        holder: object = connection if getattr(connection, "in_transaction", False) else _Statement("record_failure")
        try:
            async with asyncio.timeout(timeout):
                await self.sim.net.hop("pg")
                await self._through(None)
                while (owner := self._row_locks.get(row, holder)) is not holder:
                    await self._wait(
                        "record_failure", "", holder, owner, _seconds(incident_store.INCIDENT_LOCK_TIMEOUT)
                    )
                self._row_locks[row] = holder
                self._locks_of[holder].add(row)
                self.incidents[row] += 1
                await self.sim.net.hop("pg")
        except TimeoutError:
            if isinstance(connection, Connection):
                connection.terminate()
            raise
        finally:
            if isinstance(holder, _Statement):
                self._unlock(holder)
        return 1

    def insert_dead_letter(self, event: EventMessage) -> int | None:
        completion = self.store.completions.get(event.key)
        if completion is not None and completion.payload_sha256 == event.payload_sha256:
            return None
        opened = next(
            (
                row
                for row in self.dead_letters.values()
                if row.status == "dead"
                and (row.event.key, row.event.payload_sha256) == (event.key, event.payload_sha256)
                and (event.key, event.payload_sha256) in self.store.open_dead_letters
            ),
            None,
        )
        if opened is not None:
            return opened.id
        row = DeadLetter(next(self._dead_letter_ids), event)
        self.dead_letters[row.id] = row
        self.store.open_dead_letters.add((event.key, event.payload_sha256))
        self.sim.note("pg", "dead letter", event.key, f"#{row.id} attempt {event.attempt}")
        return row.id

    def open_dead_letters(self) -> list[DeadLetter]:
        return [
            row
            for row in self.dead_letters.values()
            if row.status == "dead" and (row.event.key, row.event.payload_sha256) in self.store.open_dead_letters
        ]


class Client:
    """`CompletionStore` of one process: the store's methods, on its pools."""

    def __init__(self, server: Server, statements: Pool, renewals: Pool, transactions: Pool):
        self._server = server
        self._pools = {"statements": statements, "renewals": renewals, "transactions": transactions}

    @contextlib.asynccontextmanager
    async def transaction(self, session: in_memory.Session):
        server, ended = self._server, False
        try:
            await server.statement("BEGIN", _nothing, (), session, None)
            async with server.store.transaction(session):
                yield
                await server.statement("COMMIT", _nothing, (), session, None)  # fails: rolled back
            server.transaction_ended(session, committed=True)
            ended = True
            await server.statement("COMMIT's reply", _nothing, (), session, None)  # fails: committed all the same
        finally:
            if not ended:
                server.transaction_ended(session, committed=False)

    def __getattr__(self, name: str):
        method = getattr(self._server.store, name)
        if inspect.isasyncgenfunction(getattr(method, "__wrapped__", None)):  # a session: a pooled connection
            return self._held(name, method)
        if not inspect.iscoroutinefunction(method):
            return method

        resent = resends_on_conflict(name)

        async def call(*args, **kwargs):
            session = next((a for a in (*args, *kwargs.values()) if isinstance(a, in_memory.Session)), None)
            if session is not None:  # its own limit if it has one (a lease), else the lease timer's

                async def send():
                    return await self._server.statement(
                        name, lambda: method(*args, **kwargs), args, session, TIMEOUTS.get(name)
                    )
            else:

                async def send():
                    return await self._pooled(name, lambda: method(*args, **kwargs), args)

            if resent and (session is None or session.undo is None):
                result = await completions._fetch_again_on_conflict(_Resent(send), "", timeout=0)
            else:
                result = await send()
            if name == "take_leases":
                self._server.leases_taken(result)
            elif name == "release_leases":
                self._server.leases_released(next((a for a in args if isinstance(a, list)), []))
            return result

        return call

    def _held(self, name: str, method):
        @contextlib.asynccontextmanager
        async def held(*args, **kwargs):
            async with self._pools[POOLS.get(name, "statements")].acquire():
                await self._server.sim.net.hop("pg")
                async with method(*args, **kwargs) as session:
                    yield session

        return held

    async def _pooled(self, name: str, run, args: tuple):
        timeout = args[1] / 3000 if name == "extend_leases" else TIMEOUTS.get(name, DEFAULT_TIMEOUT)
        pool = self._pools[POOLS.get(name, "statements")]
        waits = pauses()
        while True:
            try:
                async with pool.acquire(timeout=timeout):
                    return await self._server.statement(name, run, args, None, timeout)
            except Killed:
                raise
            except Exception:
                if name in SWALLOWS:
                    return None
                if name not in RETRIES:
                    raise
            await asyncio.sleep(next(waits))


async def _nothing() -> None:
    return None
