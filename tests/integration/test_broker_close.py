"""The ingress stops when told to, however its connection to RabbitMQ closes:
a real `webhook-ingest ingress` whose socket is made slow (or unable) to
close, as a TLS connection is while the broker does not answer its
close_notify — a prelude swaps the writer class the connection uses."""

import asyncio
import signal
import subprocess

from tests.support.processes import Process, wait_for_output

WRITERS = """
import asyncio
from webhook_ingest.ingress.publishing import publisher
from webhook_ingest.shared.broker import coalesced_writes


class SlowlyClosing(coalesced_writes.CoalescingWriter):
    async def wait_closed(self):
        await asyncio.sleep(1.0)
        await super().wait_closed()


class NeverClosing(coalesced_writes.CoalescingWriter):  # the socket never closes: only an abort ends it
    def write_eof(self):
        self.flush()

    def close(self):
        self.flush()
"""
SLOWLY_CLOSING = WRITERS + "coalesced_writes.CoalescingWriter = SlowlyClosing\n"
NEVER_CLOSING = WRITERS + "coalesced_writes.CoalescingWriter = NeverClosing\npublisher.CLOSE_TIMEOUT = 0.5\n"


async def exit_code(process: Process, within: float) -> int | None:
    try:
        return await asyncio.to_thread(process.popen.wait, within)
    except subprocess.TimeoutExpired:
        return None


async def test_an_ingress_told_twice_to_stop_while_its_broker_connection_closes_exits(fleet):
    ingress, _ = fleet.ingress(prelude=SLOWLY_CLOSING)
    await wait_for_output(ingress, "broker_connected")
    ingress.popen.send_signal(signal.SIGINT)
    await asyncio.sleep(0.3)  # its connection is closing: Close-Ok came, the socket's close takes 1 s
    ingress.popen.send_signal(signal.SIGTERM)
    assert await exit_code(ingress, within=5) == 0, ingress.output()


async def test_an_ingress_whose_broker_connection_does_not_close_exits_after_its_limit(fleet):
    ingress, _ = fleet.ingress(prelude=NEVER_CLOSING)
    await wait_for_output(ingress, "broker_connected")
    ingress.popen.send_signal(signal.SIGTERM)
    assert await exit_code(ingress, within=5) == 0, ingress.output()
