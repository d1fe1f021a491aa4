"""Redlock over independent Redis masters, written here on redis.asyncio.

Why our own: aioredlock, the asyncio implementation, is abandoned (it needs
aioredis<2); the other libraries are synchronous or do not let the lock key
also carry the idempotency claim. The algorithm is ~100 lines:

- acquire: on every master at once, `SET key lock:<random> NX PX ttl GET`
  — the claim is a plain SET NX, and GET tells us in the same round trip what
  holds the key when we lose ("done:<sha256>" once completed, or another
  "lock:…"). The lock is ours when a majority (N//2+1) said yes within its
  validity: ttl minus the time acquiring took minus a clock drift allowance
  (1 % of ttl + 2 ms). Otherwise the masters we did win are released (a
  batch's keys in one pipeline per master; a master that did not answer is
  left to the TTL: docs/design.md#redis-unreachable).
- extend: a compare-and-pexpire script, while the handler runs (a worker's
  renewals of one moment pipelined together: workers/claim/renewals.py).
- release: a compare-and-delete script, so we never delete a lock that
  expired and was taken by someone else, nor a done marker.

This lock alone cannot guarantee one writer (it can expire under a paused
holder, or be forgotten); what does, and the fencing token's part:
docs/design.md#exclusion.
"""

import asyncio
import importlib.resources
import time
import uuid
from dataclasses import dataclass

import redis.asyncio as redis

from webhook_ingest.shared.db import parse_queries
from webhook_ingest.shared.service_errors import REDIS_ERRORS

_SCRIPTS = parse_queries(importlib.resources.files("webhook_ingest.workers").joinpath("redlock.lua").read_text())


@dataclass(frozen=True)
class Lock:
    key: str
    value: str
    valid_until: float  # time.monotonic() deadline, before drift


@dataclass(frozen=True)
class AcquireResult:
    lock: Lock | None = None
    holder_value: str | None = None  # what holds the key when we did not get it
    reachable: int = 0  # masters that answered


class Redlock:
    def __init__(self, clients: list[redis.Redis], ttl_seconds: float):
        self.clients = clients
        self.ttl_ms = int(ttl_seconds * 1000)
        self.quorum = len(clients) // 2 + 1
        self._extend = [client.register_script(_SCRIPTS["extend"]) for client in clients]
        self._release = [client.register_script(_SCRIPTS["release"]) for client in clients]

    async def acquire(self, key: str) -> AcquireResult:
        value = f"lock:{uuid.uuid4().hex}"
        started = time.monotonic()
        replies = await asyncio.gather(
            *(c.set(key, value, nx=True, px=self.ttl_ms, get=True) for c in self.clients),
            return_exceptions=True,
        )
        won = sum(1 for reply in replies if reply is None)
        answers = [reply for reply in replies if not isinstance(reply, BaseException)]
        validity = self.ttl_ms / 1000 - (time.monotonic() - started) - self._drift()
        if won >= self.quorum and validity > 0:
            return AcquireResult(Lock(key, value, started + validity), reachable=len(answers))
        if won:
            await self.release(Lock(key, value, 0))
        return AcquireResult(holder_value=_holder(answers), reachable=len(answers))

    async def acquire_many(self, keys: list[str]) -> list[AcquireResult]:
        """`acquire` for many keys in one pipelined round trip per master."""
        values = [f"lock:{uuid.uuid4().hex}" for _ in keys]
        started = time.monotonic()
        per_master = await asyncio.gather(*(self._set_nx_pipeline(c, keys, values) for c in self.clients))
        validity = self.ttl_ms / 1000 - (time.monotonic() - started) - self._drift()
        results: list[AcquireResult] = []
        given_back: list[list[Lock]] = [[] for _ in self.clients]  # per master: ours there, not won overall
        for index, (key, value) in enumerate(zip(keys, values)):
            replies = [master[index] for master in per_master]
            answers = [reply for reply in replies if not isinstance(reply, BaseException)]
            won = sum(1 for reply in answers if reply is None)
            if won >= self.quorum and validity > 0:
                results.append(AcquireResult(Lock(key, value, started + validity), reachable=len(answers)))
                continue
            for locks, reply in zip(given_back, replies):
                if reply is None:
                    locks.append(Lock(key, value, 0))
            results.append(AcquireResult(holder_value=_holder(answers), reachable=len(answers)))
        # Given back in one pipeline per master that set some, not a call
        # per key and master: with two masters hung every key is won on the
        # third alone, and a batch's callers waited on hundreds of
        # connections, each into a hung master a socket timeout. A master
        # that did not answer is sent nothing: its copy lasts the TTL at
        # most (docs/design.md#redis-unreachable).
        await asyncio.gather(
            *(
                self._script_pipeline(client, script, locks)
                for client, script, locks in zip(self.clients, self._release, given_back)
                if locks
            )
        )
        return results

    async def _set_nx_pipeline(self, client: redis.Redis, keys: list[str], values: list[str]) -> list:
        """One reply per key: None (we set it), the holder's value, or the error."""
        try:
            async with client.pipeline(transaction=False) as pipe:
                for key, value in zip(keys, values):
                    pipe.set(key, value, nx=True, px=self.ttl_ms, get=True)
                return await pipe.execute(raise_on_error=False)
        except REDIS_ERRORS as exc:
            return [exc] * len(keys)

    async def extend(self, lock: Lock) -> Lock | None:
        """A lock valid for another ttl, or None if a majority no longer has it."""
        started = time.monotonic()
        replies = await self._on_all(self._extend, lock.key, lock.value, self.ttl_ms)
        kept = sum(1 for reply in replies if reply == 1)
        if kept < self.quorum:
            return None
        return Lock(lock.key, lock.value, started + self.ttl_ms / 1000 - self._drift())

    async def extend_many(self, locks: list[Lock]) -> list[Lock | None]:
        """`extend` for many locks, in one pipelined round trip per master."""
        started = time.monotonic()
        per_master = await asyncio.gather(
            *(
                self._script_pipeline(client, script, locks, self.ttl_ms)
                for client, script in zip(self.clients, self._extend)
            )
        )
        valid_until = started + self.ttl_ms / 1000 - self._drift()
        extended: list[Lock | None] = []
        for index, lock in enumerate(locks):
            kept = sum(1 for master in per_master if master[index] == 1)
            extended.append(Lock(lock.key, lock.value, valid_until) if kept >= self.quorum else None)
        return extended

    async def _script_pipeline(self, client: redis.Redis, script, locks: list[Lock], *args) -> list:
        """The script on each lock (its key; its value, then `args`), pipelined.
        One reply per lock — extend's and release's: 1 (done), 0 (not ours
        any more) — or the error."""
        try:
            async with client.pipeline(transaction=False) as pipe:
                for lock in locks:
                    await script(keys=[lock.key], args=[lock.value, *args], client=pipe)
                return await pipe.execute(raise_on_error=False)
        except REDIS_ERRORS as exc:
            return [exc] * len(locks)

    async def release(self, lock: Lock) -> None:
        await self._on_all(self._release, lock.key, lock.value)

    async def set_everywhere(self, key: str, value: str, ttl_seconds: int) -> int:
        """Overwrites `key` on every master (a done marker); returns how many took it."""
        replies = await asyncio.gather(
            *(c.set(key, value, ex=ttl_seconds) for c in self.clients), return_exceptions=True
        )
        return sum(1 for reply in replies if reply is True)

    async def set_many_everywhere(self, items: list[tuple[str, str]], ttl_seconds: int) -> int:
        """`set_everywhere` for many keys, pipelined; returns the writes that failed."""

        async def write(client: redis.Redis) -> int:
            try:
                async with client.pipeline(transaction=False) as pipe:
                    for key, value in items:
                        pipe.set(key, value, ex=ttl_seconds)
                    replies = await pipe.execute(raise_on_error=False)
            except REDIS_ERRORS:
                return len(items)
            return sum(1 for reply in replies if reply is not True)

        return sum(await asyncio.gather(*(write(client) for client in self.clients)))

    async def _on_all(self, scripts, key: str, *args) -> list:
        return await asyncio.gather(*(script(keys=[key], args=args) for script in scripts), return_exceptions=True)

    def _drift(self) -> float:
        return self.ttl_ms / 1000 * 0.01 + 0.002


def _holder(answers: list) -> str | None:
    """What holds a key we lost: a done marker wins over another's lock."""
    held = [_text(answer) for answer in answers if answer is not None]
    return next((value for value in held if value.startswith("done:")), None) or next(iter(held), None)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
