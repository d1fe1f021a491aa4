"""The test proxy (tests/support/tcpproxy.py) makes outages for the suite's
fault tests: a cut must drop every connection, including one still being
made, and stop() must close every client socket it accepted. A socket left
to the garbage collector is a ResourceWarning, which the suite makes an
error in whichever test happens to collect it (a chaos run failed so)."""

import asyncio
import socket
import threading

import pytest

from tests.support.tcpproxy import TcpProxy


class HeldProxy(TcpProxy):
    """Connects upstream only once `release` is set: a connection the
    service is slow to take."""

    def __init__(self, *target):
        super().__init__(*target)
        self.connecting = threading.Event()
        self.release = threading.Event()

    async def _open_upstream(self):
        self.connecting.set()
        while not self.release.is_set():  # noqa: ASYNC110 (set from the test's thread)
            await asyncio.sleep(0.01)
        return await super()._open_upstream()


@pytest.fixture
def service():
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server


def connect(proxy: TcpProxy) -> socket.socket:
    client = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    assert proxy.connecting.wait(5)
    return client


def test_a_connection_being_made_when_the_proxy_is_cut_is_dropped(service):
    proxy = HeldProxy(*service.getsockname()).start()
    try:
        with connect(proxy) as client:
            proxy.cut()
            proxy.release.set()
            client.settimeout(3)
            try:
                assert client.recv(1) == b""
            except ConnectionResetError:
                pass
    finally:
        proxy.stop()


def test_stop_closes_a_client_whose_upstream_connection_is_still_being_made(service):
    proxy = HeldProxy(*service.getsockname()).start()
    with connect(proxy) as client:
        proxy.stop()
        client.settimeout(3)
        try:
            assert client.recv(1) == b""
        except ConnectionResetError:
            pass
