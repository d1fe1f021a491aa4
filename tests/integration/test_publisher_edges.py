"""The ingress publisher's edges (ingress/publisher.py, ingress/patience.py,
shared/coalesced_writes.py) against the real broker: a live request's
learnt patience, suspicion and its probe, and what the connection does
with the frames it has not sent yet."""

import asyncio
import time

import pytest

from webhook_ingest.ingress import patience
from webhook_ingest.ingress.publisher import GivenUp, Publisher
from tests.support.events import make_event
from tests.support.processes import wait_until
from tests.support.tcpproxy import TcpProxy


class LaggingProxy(TcpProxy):
    """A TcpProxy that forwards every chunk `lag` seconds late, in order, in
    both directions: a healthy broker whose confirms take longer (a slower
    disk, a busier machine, a relay's batch ahead on the channel)."""

    lag = 0.0

    async def _pipe(self, reader, writer) -> None:
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue = asyncio.Queue()

        async def forward() -> None:
            while (chunk := await chunks.get()) is not None:
                due, data = chunk
                if (wait := due - loop.time()) > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()

        forwarding = asyncio.create_task(forward())
        try:
            while data := await reader.read(65536):
                chunks.put_nowait((loop.time() + self.lag, data))
            chunks.put_nowait(None)
            await forwarding
        except (ConnectionError, OSError):
            pass
        finally:
            forwarding.cancel()
            writer.transport.abort()
            self._writers.discard(writer)


@pytest.fixture
async def lagging_publisher(settings):
    with LaggingProxy("127.0.0.1", 5672) as proxy:
        publisher = Publisher(proxy.url_for(settings.amqp_url), settings.namespace, settings.delivery_limit)
        publisher.start()
        try:
            await wait_until(lambda: _true(publisher.available), 10, 0.02, "the publisher to connect")
            yield proxy, publisher
        finally:
            proxy.lag = 0.0
            await publisher.close()


async def _true(value: bool) -> bool:
    return value


async def live_requests(publisher: Publisher, seconds: float, prefix: str, concurrency: int = 4
                        ) -> list[tuple[float, str]]:
    """`concurrency` requests at a time for `seconds`, each publishing live
    as the ingress does; (finished at, 'confirmed' | 'given_up' | 'refused')
    per request. A request given up would take an outbox insert (~5 ms)."""
    outcomes: list[tuple[float, str]] = []
    deadline = time.monotonic() + seconds

    async def one_connection(connection: int) -> None:
        n = 0
        while time.monotonic() < deadline:
            n += 1
            try:
                await publisher.publish(make_event("acme", f"{prefix}_{connection}_{n}"), live=True)
                outcomes.append((time.monotonic(), "confirmed"))
            except GivenUp as exc:
                outcomes.append((time.monotonic(), "given_up" if exc.pending is not None else "refused"))
                await asyncio.sleep(0.005)

    await asyncio.gather(*(one_connection(c) for c in range(concurrency)))
    return outcomes


def learnt_on_a_quiet_broker() -> patience.Patience:
    """The patience a quiet broker leaves behind (confirms in ~3 ms, two
    windows of them): its floor, 25 ms. Its clock runs a window ahead of
    the real one, so that state needs no wait."""
    ahead = [0.0]
    learnt = patience.Patience(clock=lambda: time.monotonic() + ahead[0])
    learnt.confirmed_after(0.003)
    ahead[0] = patience.WINDOW
    learnt.confirmed_after(0.003)
    assert learnt.seconds == patience.SHORTEST
    return learnt


async def test_a_broker_that_only_slows_earns_a_longer_patience(lagging_publisher):
    """A quiet broker confirmed in ~3 ms, so the patience is at its floor
    (25 ms); then every confirm takes ~40 ms more, the broker healthy
    throughout — the connection moved to another node of AMQP_URL farther
    away, a slower disk's fsync, a busier machine. design.md says a broker
    that merely slows "confirms slower and so earns a longer wait": once
    the slower confirms were seen, live requests are confirmed again, not
    sent to the outbox for as long as the broker stays so."""
    proxy, publisher = lagging_publisher
    publisher._patience = learnt_on_a_quiet_broker()
    proxy.lag = 0.02  # each way: every confirm ~40 ms later
    outcomes = await live_requests(publisher, 2.0, "slower")
    last_second = [outcome for finished, outcome in outcomes if finished > outcomes[-1][0] - 1.0]
    assert last_second.count("confirmed") >= 0.9 * len(last_second), \
        {kind: last_second.count(kind) for kind in set(last_second)}
