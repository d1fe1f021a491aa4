"""Redis masters in memory, behind the client calls `workers/claim/redlock.py` makes.

The real `IdempotencyStore` and `Redlock` run on top (the simulation
patches `workers.claim.idempotency._client` to hand out these clients), so the
claim, the quorum, the lock's validity, degraded mode and the done markers
are the product's code. Each master keeps values with an expiry in virtual
time. Its calls are await points with a seeded latency; the faults a plan
can inject: a master that does not answer (each call times out after the
client's socket timeout) or refuses connections, a master that loses its
data (restarted without persistence, or a failover to a replica that
missed the last writes), every master flushed, and a key forgotten early.
"""

import asyncio
from dataclasses import dataclass, field

import redis.exceptions

from webhook_ingest.workers.claim.idempotency import SOCKET_TIMEOUT
from webhook_ingest.workers.claim.redlock import _SCRIPTS


@dataclass
class Master:
    data: dict[str, tuple[str, float]] = field(default_factory=dict)  # key -> (value, expires at)
    down_until: float = 0.0
    refuses: bool = False  # down: refused at once, rather than timing out

    def get(self, key: str, now: float) -> str | None:
        held = self.data.get(key)
        if held is None:
            return None
        if held[1] <= now:
            del self.data[key]
            return None
        return held[0]

    def set(self, key: str, value: str, now: float, nx: bool, seconds: float | None, get: bool):
        old = self.get(key, now)
        if nx and old is not None:
            return old if get else None
        self.data[key] = (value, now + seconds if seconds is not None else float("inf"))
        return None if get else True

    def run_script(self, name: str, key: str, args, now: float) -> int:
        if self.get(key, now) != args[0]:
            return 0
        if name == "extend":
            self.data[key] = (args[0], now + int(args[1]) / 1000)
        else:
            del self.data[key]
        return 1


class Client:
    """A redis.asyncio.Redis of one process, on one master."""

    def __init__(self, sim, master: Master):
        self._sim, self._master = sim, master

    async def _call(self, apply):
        sim = self._sim
        await sim.net.hop("redis")
        now = sim.loop.time()
        if now < self._master.down_until:
            if self._master.refuses:
                raise redis.exceptions.ConnectionError("Connection refused")
            await asyncio.sleep(SOCKET_TIMEOUT)
            raise redis.exceptions.TimeoutError("Timeout reading from socket")
        result = apply(now)
        await sim.net.hop("redis")
        return result

    async def set(
        self, key: str, value: str, nx: bool = False, px: int | None = None, ex: int | None = None, get: bool = False
    ):
        seconds = px / 1000 if px is not None else ex
        return await self._call(lambda now: self._master.set(key, value, now, nx, seconds, get))

    def register_script(self, source: str):
        name = next(name for name, text in _SCRIPTS.items() if text == source)

        async def script(keys, args, client=None):
            if isinstance(client, Pipeline):  # queued, answered by the pipeline's execute
                client.queue(lambda master, now: master.run_script(name, keys[0], list(args), now))
                return client
            return await self._call(lambda now: self._master.run_script(name, keys[0], list(args), now))

        return script

    def pipeline(self, transaction: bool = False) -> "Pipeline":
        return Pipeline(self)

    async def aclose(self) -> None:
        pass


class Pipeline:
    def __init__(self, client: Client):
        self._client = client
        self._commands: list = []  # each: (master, now) -> its reply

    async def __aenter__(self) -> "Pipeline":
        return self

    async def __aexit__(self, *exc) -> None:
        pass

    def set(
        self, key: str, value: str, nx: bool = False, px: int | None = None, ex: int | None = None, get: bool = False
    ) -> None:
        seconds = px / 1000 if px is not None else ex
        self.queue(lambda master, now: master.set(key, value, now, nx, seconds, get))

    def queue(self, command) -> None:
        self._commands.append(command)

    async def execute(self, raise_on_error: bool = True) -> list:
        master = self._client._master
        return await self._client._call(lambda now: [command(master, now) for command in self._commands])
