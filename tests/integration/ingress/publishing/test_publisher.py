"""The ingress publisher's edges (ingress/publishing/publisher.py, ingress/publishing/patience.py,
shared/broker/coalesced_writes.py) against the real broker: a live request's
learnt patience, suspicion and its probe, and what the connection does
with the frames it has not sent yet."""

import asyncio
import contextlib
import ssl
import subprocess
import time

import pytest

from tests.support.broker import amqp_port
from tests.support.events import make_event
from tests.support.ingress import queued_events
from tests.support.processes import wait_until
from tests.support.tcpproxy import TcpProxy
from webhook_ingest.ingress.intake.done_markers import DoneMarkers
from webhook_ingest.ingress.intake.redis_get import connect_get
from webhook_ingest.ingress.publishing import patience
from webhook_ingest.ingress.publishing.publisher import GivenUp, Publisher
from webhook_ingest.shared.broker.coalesced_writes import CoalescingTransports
from webhook_ingest.shared.redis_keys import done_marker, key_prefix


class LaggingProxy(TcpProxy):
    """A TcpProxy that forwards every chunk `lag` seconds late, in order, in
    both directions: a healthy broker whose confirms take longer (a farther
    node, a slower disk, a busier machine)."""

    lag = 0.0

    async def _pipe(self, reader, writer, latency: float = 0.0) -> None:
        await super()._pipe(_Late(reader, self), writer, latency)


class _Late:
    """A reader whose chunks come out `proxy.lag` seconds after they came in."""

    def __init__(self, reader: asyncio.StreamReader, proxy: LaggingProxy):
        self._proxy = proxy
        self._chunks: asyncio.Queue = asyncio.Queue()
        self._reading = asyncio.create_task(self._read_ahead(reader))

    async def _read_ahead(self, reader: asyncio.StreamReader) -> None:
        loop = asyncio.get_running_loop()
        try:
            while data := await reader.read(65536):
                self._chunks.put_nowait((loop.time() + self._proxy.lag, data))
        except (ConnectionError, OSError):
            pass
        self._chunks.put_nowait((loop.time(), b""))

    async def read(self, _: int) -> bytes:
        due, data = await self._chunks.get()
        if (wait := due - asyncio.get_running_loop().time()) > 0:
            await asyncio.sleep(wait)
        return data


@pytest.fixture
async def lagging_publisher(settings):
    with LaggingProxy("127.0.0.1", amqp_port()) as proxy:
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


async def live_requests(
    publisher: Publisher, seconds: float, prefix: str, concurrency: int = 4
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
    assert last_second.count("confirmed") >= 0.9 * len(last_second), {
        kind: last_second.count(kind) for kind in set(last_second)
    }


@contextlib.asynccontextmanager
async def tls_in_front_of_the_broker(tmp_path):
    """A TLS listener on loopback that forwards to the shared broker's plain
    port, with a self-signed certificate for `localhost`: (port, cafile)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(  # noqa: ASYNC221 - the test's setup, before anything runs on the loop
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    writers: set[asyncio.StreamWriter] = set()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.transport.abort()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", amqp_port())
        writers.update((writer, upstream_writer))
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))

    server = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1], cert
    finally:
        server.close()
        for writer in writers:
            writer.transport.abort()


async def test_an_amqps_url_publishes_through_the_coalescing_transport(settings, tmp_path):
    """`amqps://` goes through shared/broker/coalesced_writes.py's factory (TLS from
    aiormq's own context provider: the URL's cafile, hostname checked) and a
    live publish is confirmed."""
    async with tls_in_front_of_the_broker(tmp_path) as (port, cafile):
        publisher = Publisher(
            f"amqps://guest:guest@localhost:{port}/?cafile={cafile}", settings.namespace, settings.delivery_limit
        )
        publisher.start()
        try:
            await wait_until(lambda: _true(publisher.available), 10, 0.02, "the publisher to connect over TLS")
            assert isinstance(publisher._open_connection.kwargs["transport_factory"], CoalescingTransports)
            for n in range(3):
                await publisher.publish(make_event("acme", f"evt_tls_{n}"), live=True)
        finally:
            await publisher.close()
    assert sorted(e.event_id for e in await queued_events(settings.amqp_url, settings.namespace)) == [
        "evt_tls_0",
        "evt_tls_1",
        "evt_tls_2",
    ]


async def test_gets_unsent_when_their_connection_closes_fail_and_never_answer_duplicate(settings, redis_cleanup):
    """The GET pipeline's commands of one loop iteration wait for its end
    (ingress/intake/redis_get.py); a connection that closes before then fails
    them, each lookup takes the normal path (False), and lookups on the next
    connection are each answered with their own key's marker."""
    import redis.asyncio as redis

    sha = "a" * 64
    client = redis.from_url(settings.redis_urls[0])
    await client.set(key_prefix(settings.namespace) + "acme:evt_done", done_marker(sha))
    await client.aclose()
    pipeline = connect_get(settings.redis_urls[0], 0.5, 0.5)
    assert pipeline is not None
    keys = [f"acme:evt_{n}" for n in range(20)] + ["acme:evt_done"] + [f"acme:evt_{n}" for n in range(20, 40)]
    try:
        assert await DoneMarkers(pipeline.get, settings.namespace).completed_with("acme:evt_done", sha)
        connection = pipeline._connection
        markers = DoneMarkers(pipeline.get, settings.namespace)
        lookups = [asyncio.create_task(markers.completed_with(key, sha)) for key in keys]
        await asyncio.sleep(0)  # every lookup sent its GET; the iteration's send is still to come
        assert connection._unsent, "the GETs wait for the iteration's end"
        connection.transport.abort()
        assert await asyncio.gather(*lookups) == [False] * len(keys)

        markers = DoneMarkers(pipeline.get, settings.namespace)  # not skipping after the failure
        answers = await asyncio.gather(*(markers.completed_with(key, sha) for key in keys))
        assert pipeline._connection is not connection
        assert [key for key, done in zip(keys, answers) if done] == ["acme:evt_done"]
    finally:
        await pipeline.close()
