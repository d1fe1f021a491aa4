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
  (as `workers/completions.py` does).

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
too, with the statement `shared/dead_letters.record_dead_letter` makes.
"""

import asyncio
import contextlib
import inspect
from collections import defaultdict
from dataclasses import dataclass
from itertools import count

import asyncpg

from tests.support import in_memory
from tests.sim.network import Killed
from webhook_ingest.shared.backoff import pauses
from webhook_ingest.shared.message import EventMessage
from webhook_ingest.workers.lease import Lease

SWALLOWS = {"release_leases"}  # best effort: a lease not released runs out by itself
RETRIES = {"record_handed_on"}  # returns only once committed, waiting while Postgres is away
# Which of the process's pools a method takes a connection from (the others: "statements"),
# as `CompletionStore` does; before its three pools, the one pool stands for all three.
POOLS = {"session": "transactions", "extend_leases": "renewals"}
TIMEOUTS = {"take_leases": 5.0, "check_completed": 5.0, "complete_alone": 5.0, "release_leases": 5.0,
            "record_handed_on": 10.0, "completed_sha256": 5.0, "settled_before": 5.0, "probe_writable": 2.0,
            "record_dead_letter": 10.0}
DEFAULT_TIMEOUT = 5.0  # a statement of ours outside the handler's transaction (STATEMENT_SECONDS)


def session_lost() -> asyncpg.exceptions.ConnectionDoesNotExistError:
    return asyncpg.exceptions.ConnectionDoesNotExistError("connection was closed in the middle of operation")


class Connection:
    """A pooled connection handed to code that runs SQL of its own (the dead-letter insert)."""

    def __init__(self) -> None:
        self.closed = False

    def is_closed(self) -> bool:
        return self.closed

    def terminate(self) -> None:
        self.closed = True

    def transaction(self) -> contextlib.AbstractAsyncContextManager[None]:
        """The dead-letter insert's transaction, which holds its incident count
        too: with incidents not simulated, the insert alone, atomic as it is."""
        return contextlib.nullcontext()


class Pool:
    """asyncpg.Pool's acquire: at most `size` at once, the others wait in turn."""

    def __init__(self, loop, size: int):
        self._loop, self.size, self._free = loop, size, size
        self._waiters: list[asyncio.Future] = []
        self.peak = 0

    @contextlib.asynccontextmanager
    async def acquire(self, timeout: float | None = None):
        await self._take(timeout)
        self.peak = max(self.peak, self.size - self._free)
        try:
            yield Connection()
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
        self._row_locks: dict[str, in_memory.Session] = {}
        self._locks_of: dict[in_memory.Session, set[str]] = defaultdict(set)
        self._ended: dict[in_memory.Session, asyncio.Event] = {}
        self._pending: dict[in_memory.Session, list[Effect]] = defaultdict(list)

    # -- one statement ----------------------------------------------------------

    async def statement(self, name: str, run, args: tuple, session: in_memory.Session | None,
                        timeout: float | None):
        try:
            async with asyncio.timeout(timeout):
                return await self._statement(run, self._keys(args), session)
        except TimeoutError:
            if session is not None:
                session.terminate()  # closed_if_left_by: the session is closed, not cancelled
            self.sim.note("pg", "timed out", None, name)
            raise

    async def _statement(self, run, keys: set[str], session: in_memory.Session | None):
        await self._wait_for_rows(keys, session)
        await self.sim.net.hop("pg")
        await self._through(session)
        written = len(session.undo) if session is not None and session.undo is not None else None
        result = await run()
        if written is not None and session is not None and session.undo is not None and len(session.undo) > written:
            self._lock_rows(keys, session)
        await self._through(session)
        await self.sim.net.hop("pg")
        return result

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

    async def _wait_for_rows(self, keys: set[str], session: in_memory.Session | None) -> None:
        while True:
            holder = next((self._row_locks[k] for k in keys if self._row_locks.get(k, session) is not session), None)
            if holder is None:
                return
            await self._ended.setdefault(holder, asyncio.Event()).wait()

    def _lock_rows(self, keys: set[str], session: in_memory.Session) -> None:
        for key in keys:
            self._row_locks[key] = session
        self._locks_of[session] |= keys

    def transaction_ended(self, session: in_memory.Session, committed: bool) -> None:
        for key in self._locks_of.pop(session, set()):
            if self._row_locks.get(key) is session:
                del self._row_locks[key]
        ended = self._ended.pop(session, None)
        if ended is not None:
            ended.set()
        for effect in self._pending.pop(session, []):
            if committed:
                effect.committed = True
                self._count_effects(effect.key)

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
        """shared/dead_letters.record_dead_letter: one open dead letter per
        event, none for an event completed with this payload."""
        async def insert() -> int | None:
            return self.insert_dead_letter(event)

        return await self.statement("record_dead_letter", insert, (event,), None, timeout)

    def insert_dead_letter(self, event: EventMessage) -> int | None:
        completion = self.store.completions.get(event.key)
        if completion is not None and completion.payload_sha256 == event.payload_sha256:
            return None
        opened = next((row for row in self.dead_letters.values() if row.status == "dead"
                       and (row.event.key, row.event.payload_sha256) == (event.key, event.payload_sha256)
                       and (event.key, event.payload_sha256) in self.store.open_dead_letters), None)
        if opened is not None:
            return opened.id
        row = DeadLetter(next(self._dead_letter_ids), event)
        self.dead_letters[row.id] = row
        self.store.open_dead_letters.add((event.key, event.payload_sha256))
        self.sim.note("pg", "dead letter", event.key, f"#{row.id} attempt {event.attempt}")
        return row.id

    def open_dead_letters(self) -> list[DeadLetter]:
        return [row for row in self.dead_letters.values() if row.status == "dead"
                and (row.event.key, row.event.payload_sha256) in self.store.open_dead_letters]


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

        async def call(*args, **kwargs):
            session = next((a for a in (*args, *kwargs.values()) if isinstance(a, in_memory.Session)), None)
            if session is not None:  # its own limit if it has one (a lease), else the lease timer's
                return await self._server.statement(name, lambda: method(*args, **kwargs), args, session,
                                                    TIMEOUTS.get(name))
            return await self._pooled(name, lambda: method(*args, **kwargs), args)

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
