"""`ctx.db`: the handler's transaction, opened at its first use.

A handler that only calls the network (`forward`, a payment API) never
touches `ctx.db`, and so holds no Postgres connection while it waits: a
worker runs as many of those at once as it has messages in flight, not as
many as its pool has connections (issue 20). Its completion is then an
autocommit statement outside any transaction of the handler's, shared with
other runs' (workers/claim/coalesced.py), fenced by its token like any other.

A handler that does use `ctx.db` gets, at its first query, a pooled
connection in a transaction that first takes the key's turn
(docs/design.md, "Exclusion"); its writes commit in the same transaction as
the completion row, or not at all. So do the network calls a handler can do
first before its first query: the connection is held from that query to
the commit. An ordered row's handler that queries soon after it starts
gets it opened as it starts, beside its own work (`open_early`,
workers/claim/processor.py): a hot ordering key waits on each run.

The queries a handler may send are asyncpg's `Connection` coroutines
(`execute`, `fetch`, `fetchrow`, `fetchval`, `executemany`, the `copy_*`
ones); `await ctx.db.connection()` gives the connection itself, inside the
transaction, for anything else (a savepoint with `transaction()`, a
prepared statement).
"""

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from webhook_ingest.shared.observability import get_logger
from webhook_ingest.workers.failures import when_let_in

from .ports import CompletionStorePort

log = get_logger(__name__)
_QUERIES = frozenset(
    {
        "execute",
        "executemany",
        "fetch",
        "fetchrow",
        "fetchval",
        "fetchmany",
        "copy_from_query",
        "copy_from_table",
        "copy_to_table",
        "copy_records_to_table",
    }
)


class TurnRefused(Exception):
    """Another run holds the key's turn in Postgres: this run must not go on
    (the processor defers it, whatever the handler made of the error)."""


class HandlerReturned(RuntimeError):
    """`ctx.db` used after its handler returned (a task the handler left
    running): its run is completing or over, so no write may join it."""


class HandlerTransaction:
    def __init__(
        self, completions: CompletionStorePort[Any], key: str, complete_alone: Callable[[Any, int], Awaitable[bool]]
    ):
        self._completions = completions  # CompletionStore, or a stand-in (workers/claim/ports.py)
        self._complete_alone = complete_alone  # the completion without ctx.db (workers/claim/coalesced.py)
        self._key = key
        self._opening = asyncio.Lock()
        self._closing = contextlib.AsyncExitStack()
        self._connection: Any = None  # once the turn is had
        self._session: Any = None  # from the moment one is acquired: what `terminate` closes
        self._returned = False
        self._early: asyncio.Task | None = None  # opening ahead of the first query (`open_early`)
        self.turn_refused = False
        self.open_error: BaseException | None = None  # what opening the transaction raised (Postgres away)
        self.first_query_at: float | None = None  # time.monotonic() of the handler's first use

    @property
    def opened(self) -> bool:
        return self._connection is not None

    @property
    def queries_refused(self) -> bool:
        """Whether the handler's queries met a turn held elsewhere. An early
        opening refused while the handler never queried is not: opened at
        its first query, it would never have asked for the turn, and its
        run completes alone as it would have (its calls made once)."""
        return self.turn_refused and self.first_query_at is not None

    def open_early(self) -> None:
        """Starts opening the transaction now, beside what the handler does
        before its first query, instead of at that query: for a handler
        known to query soon after it starts (a hot ordering key's, whose
        rows wait on each run's latency: docs/design.md, "Ordering keys").
        One try, no waiting on a full server: a failed or refused opening
        is left to the first query to meet, as it would have (a turn held
        elsewhere is `turn_refused` at once)."""
        self._early = asyncio.create_task(self._open_once_early())

    async def _open_once_early(self) -> None:
        async with self._opening:
            if self._returned or self._connection is not None or self.turn_refused:
                return
            try:
                await self._open()
            except TurnRefused:
                pass  # turn_refused: the handler's first query says so (none: it completes alone)
            except Exception:  # noqa: BLE001 - the first query opens again, and meets what this met
                self.open_error = None

    async def connection(self) -> asyncpg.Connection:
        """The connection in the handler's transaction, opened at the first call."""
        if self.first_query_at is None:
            self.first_query_at = time.monotonic()
        async with self._opening:
            if self._returned:
                raise HandlerReturned(f"ctx.db of {self._key} used after its handler returned")
            if self.turn_refused:
                raise TurnRefused(self._key)
            if self._connection is None:
                await self._open_when_let_in()
        return self._connection

    async def _open_when_let_in(self) -> None:
        """`_open`, again and again while the server refuses the session for
        want of room (max_connections, a role's limit): a full server is an
        outage to wait out, like one that does not answer, never the
        handler's failure — and waiting here, under the lease, does not run
        what the handler did before its first query once more
        (docs/design.md, "Outages are not failures")."""

        async def open_once() -> None:
            try:
                await self._open()
            except asyncpg.TooManyConnectionsError:
                self.open_error = None  # waited out, not the handler's
                raise

        await when_let_in(open_once, self._key)

    async def _open(self) -> None:
        """The session, its transaction and the key's turn. A failed attempt
        leaves nothing open: its session is closed, not rolled back (a
        rollback behind a cancelled statement waits for the server), so a
        handler that gave up on a query (its own timeout) may query again."""
        attempt = contextlib.AsyncExitStack()
        try:
            self._session = connection = await attempt.enter_async_context(self._completions.session())
            await attempt.enter_async_context(self._completions.transaction(connection))
            turn = await self._completions.take_turn(connection, self._key)
        except BaseException as exc:
            self.terminate()
            self._session = None
            with contextlib.suppress(Exception):  # the closed session's rollback fails: nothing to undo
                await attempt.aclose()
            if isinstance(exc, Exception):
                self.open_error = exc  # Postgres away: an outage, not the handler's failure
            raise  # a cancellation is its canceller's: the handler's own timeout, a lost lease, a shutdown
        await self._closing.enter_async_context(attempt)
        if not turn:
            self.turn_refused = True
            raise TurnRefused(self._key)
        self._connection = connection

    def __getattr__(self, name: str) -> Any:
        if name not in _QUERIES:
            raise AttributeError(f"ctx.db has no {name!r}: use 'await ctx.db.connection()' for the connection itself")

        async def query(*args: Any, **kwargs: Any) -> Any:
            connection = await self.connection()
            return await getattr(connection, name)(*args, **kwargs)

        return query

    async def complete(self, message: Any, token: int) -> bool:
        """The completion row: in the handler's transaction when it has one,
        else in a statement of its own. False when refused (a stale token, or
        completed meanwhile)."""
        await self._give_up_unused_early()
        async with self._opening:  # a query of a task the handler left running waits for this, then is refused
            self._returned = True
        if self.open_error is not None:  # the handler went on without the writes it tried
            raise self.open_error
        if self._connection is None:
            # a new statement session a full server refuses: waited out here, the handler's calls made
            return await when_let_in(lambda: self._complete_alone(message, token), self._key)
        return await self._completions.complete_event(self._connection, message, token)

    async def _give_up_unused_early(self) -> None:
        """An early opening still waiting for a session (a full pool: other
        runs' transactions) when its handler returned without a query is
        given up: opened at its first query, the run would never have asked
        for one, and completes alone without waiting on that pool."""
        early = self._early
        if early is not None and not early.done() and self.first_query_at is None and self._session is None:
            early.cancel()
            await asyncio.wait([early])

    async def __aenter__(self) -> "HandlerTransaction":
        return self

    async def __aexit__(self, *exc_info: Any) -> bool | None:
        """Commits when the block succeeded, rolls back when it raised; the
        connection goes back to the pool either way."""
        self._returned = True
        try:
            if self._early is not None and not self._early.done():  # the block raised before it was needed
                self._early.cancel()
                await asyncio.wait([self._early])
        finally:
            closed = await self._closing.__aexit__(*exc_info)
        return closed

    def is_closed(self) -> bool:
        """Whether the handler's queries lost their connection (or never got one)."""
        if self._connection is None:
            return self.open_error is not None
        return bool(self._connection.is_closed())

    def terminate(self) -> None:
        """Drops the session at once (a lost lease: never wait on a rollback)."""
        if self._session is not None:
            # a session lost mid-statement is released by the pool already: its proxy refuses even this
            with contextlib.suppress(asyncpg.InterfaceError):
                self._session.terminate()
