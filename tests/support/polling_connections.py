"""One Postgres connection per test database for the polls of `count_rows`.

A test waits on rows by polling every 50 ms, a few hundred times; a new
connection for each poll cost the machine ~5-10 ms of CPU (a backend forked
and authenticated, asyncpg's handshake), a reused one ~0.2 ms. The `database`
fixture opens the way for its database (`allow`) and closes the connection
on its teardown (`close`), in the test's event loop. Anything else (another
loop, a database no fixture allowed: the chaos and bench scripts) is told
`NotPolled`, and connects for its one query, as before.
"""

import asyncio
import contextlib

import asyncpg

_allowed: set[str] = set()
_open: dict[str, "_Polling"] = {}


# The session ended under the poll (a test terminating backends, a restart):
# a poll on a new connection each time would not have seen it.
_ENDED = (
    asyncpg.ConnectionDoesNotExistError,
    asyncpg.InterfaceError,
    asyncpg.exceptions.OperatorInterventionError,
    OSError,
)


class NotPolled(Exception):
    """No polling connection here: another loop, or a database no fixture allowed."""


class _Polling:
    def __init__(self, loop: asyncio.AbstractEventLoop, connection: asyncpg.Connection):
        self.loop = loop
        self.connection = connection
        self.lock = asyncio.Lock()  # one query at a time, as polls running at once would each have had their own


def allow(database_url: str) -> None:
    _allowed.add(database_url)


async def fetchval(database_url: str, query: str):
    """The query's value over this database's polling connection, opened on
    first use; one that the test's own doings ended is replaced once."""
    for attempt in range(2):
        polling = await _polling(database_url)
        async with polling.lock:
            try:
                return await polling.connection.fetchval(query)
            except _ENDED:
                _discard(database_url, polling)
                if attempt:
                    raise
            except BaseException:  # a cancelled poll leaves the connection mid-query
                _discard(database_url, polling)
                raise
    raise AssertionError("unreachable")


async def _polling(database_url: str) -> _Polling:
    if database_url not in _allowed:
        raise NotPolled(database_url)
    loop = asyncio.get_running_loop()
    polling = _open.get(database_url)
    if polling is not None and polling.loop is not loop:
        raise NotPolled(database_url)
    if polling is None or polling.connection.is_closed():
        # No statement cache: a test may change the schema under its polls (the upgrade tests).
        polling = _Polling(loop, await asyncpg.connect(database_url, statement_cache_size=0))
        _open[database_url] = polling
    return polling


def _discard(database_url: str, polling: _Polling) -> None:
    if _open.get(database_url) is polling:
        del _open[database_url]
    polling.connection.terminate()


async def close(database_url: str) -> None:
    _allowed.discard(database_url)
    polling = _open.pop(database_url, None)
    if polling is None:
        return
    if polling.loop is not asyncio.get_running_loop():
        with contextlib.suppress(Exception):  # its loop may be gone
            polling.connection.terminate()
        return
    try:
        await asyncio.wait_for(polling.connection.close(), 10)
    except Exception:  # noqa: BLE001 - a server that ended the session first (DROP ... WITH FORCE, a test's kill)
        polling.connection.terminate()
