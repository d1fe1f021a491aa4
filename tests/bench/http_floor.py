"""What an HTTP request costs before anything of ours runs: a bare aiohttp
server (uvloop, as the ingress) that reads the body and answers a fixed
200, under the bench's own load client and requests. `http_floor_cpu_ms`
is its CPU per request, the yardstick for the ingress's own CPU per
request; `http_floor_client_cpu_ms` the load client's."""

import asyncio
import sys
import time

from tests.bench import httpload
from tests.bench.cpu import cpu_seconds
from tests.support.tcpproxy import free_port

REQUESTS = 20_000

SERVER = """
import sys
import uvloop
from aiohttp import web

async def accept(request):
    await request.read()
    return web.Response(body=b'{"status":"accepted","key":"bench:x"}', content_type="application/json")

app = web.Application()
app.router.add_post("/webhooks/{source}", accept)
uvloop.install()
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


async def measure(source: str, secret: str) -> dict[str, float]:
    port = free_port()
    server = await asyncio.create_subprocess_exec(sys.executable, "-c", SERVER, str(port))
    try:
        await _until_listening(port)
        await httpload.closed_loop(port, httpload.signed_requests(source, secret, "floorwarm_", 2_000))
        requests = httpload.signed_requests(source, secret, "floor_", REQUESTS)
        server_before, client_before = cpu_seconds(server.pid), time.process_time()
        with httpload.gc_paused():
            _, _, statuses = await httpload.closed_loop(port, requests)
        server_cpu, client_cpu = cpu_seconds(server.pid) - server_before, time.process_time() - client_before
    finally:
        server.terminate()
        await asyncio.wait_for(server.wait(), 10)
    assert set(statuses) == {200}, statuses
    return {"http_floor_cpu_ms": 1000 * server_cpu / REQUESTS, "http_floor_client_cpu_ms": 1000 * client_cpu / REQUESTS}


async def _until_listening(port: int) -> None:
    for _ in range(200):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.05)
            continue
        writer.close()
        await writer.wait_closed()
        return
    raise RuntimeError("the bare aiohttp server did not start")
