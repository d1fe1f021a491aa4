"""`forward`'s delivery rate (docs/reference.md §7): with
`handler_options.rate_limit = { per_second = 20 }`, a downstream gets no
more than 20 POSTs in any second, however many workers forward to it, and
every event still arrives, once.

Measured where it matters, at the receiver, from its arrival times. The
limiter promises at most `burst + per_second * T` grants in any T seconds;
arrivals add the jitter of getting each POST there (two workers and the
receiver on this machine's two cores), so a window may hold a little more
than the grants did. JITTER_ALLOWANCE is that slack: generous, yet far
below what the same backlog does unpaced (all 60 within a fraction of a
second)."""

import asyncio
import bisect
import collections

import pytest
from aiohttp import web

from tests.support.events import make_event, publish_events
from tests.support.exactly_once import SECRET, metered_worker, until_completed
from tests.support.processes import count_rows, outcomes, wait_for_output
from tests.support.tcpproxy import free_port

EVENTS = 60
PER_SECOND = 20
BURST = 1  # the default
JITTER_ALLOWANCE = 5


@pytest.fixture
async def receiver():
    """A downstream answering 200 at once; (its URL, the arrival times of each Idempotency-Key)."""
    arrivals: dict[str, list[float]] = collections.defaultdict(list)

    async def receive(request: web.Request) -> web.Response:
        arrivals[request.headers["Idempotency-Key"]].append(asyncio.get_running_loop().time())
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/hook", receive)
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}/hook", arrivals
    await runner.cleanup()


def write_sources(path, url: str) -> str:
    path.write_text(
        f'[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["{SECRET}"]\nhandler = "forward"\n'
        f'handler_options = {{ url = "{url}", rate_limit = {{ per_second = {PER_SECOND} }} }}\n'
    )
    return str(path)


def most_in_one_second(times: list[float]) -> int:
    times = sorted(times)
    return max(bisect.bisect_right(times, start + 1.0) - n for n, start in enumerate(times))


async def forward_backlog(settings, workers: list) -> list:
    for worker, _ in workers:
        await wait_for_output(worker, "worker_consuming")  # all of them take part from the first event
    events = [make_event("acme", f"evt_{n}") for n in range(EVENTS)]
    await publish_events(settings.amqp_url, settings.namespace, events)
    await until_completed(settings.database_url, EVENTS, timeout=60)
    return events


async def processed_by(metrics_url: str) -> float:
    return (await outcomes([metrics_url])).get("processed", 0)


async def test_two_workers_share_the_rate_and_every_event_arrives_once(settings, fleet, tmp_path, receiver):
    url, arrivals = receiver
    env = {"WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", url)}
    workers = [metered_worker(fleet, env) for _ in range(2)]
    events = await forward_backlog(settings, workers)

    assert {key: len(times) for key, times in arrivals.items()} == {event.key: 1 for event in events}
    assert (
        most_in_one_second([t for times in arrivals.values() for t in times]) <= PER_SECOND + BURST + JITTER_ALLOWANCE
    )
    assert all([await processed_by(metrics_url) > 0 for _, metrics_url in workers])  # both forwarded
    assert await count_rows(settings.database_url, "dead_letters") == 0


async def test_with_redis_away_a_worker_paces_on_its_own(settings, fleet, tmp_path, receiver):
    url, arrivals = receiver
    env = {
        "WEBHOOK_INGEST_SOURCES": write_sources(tmp_path / "s.toml", url),
        "REDIS_URLS": f"redis://127.0.0.1:{free_port()}/0",
    }  # nothing listens there
    worker = metered_worker(fleet, env)
    events = await forward_backlog(settings, [worker])

    assert {key: len(times) for key, times in arrivals.items()} == {event.key: 1 for event in events}
    assert (
        most_in_one_second([t for times in arrivals.values() for t in times]) <= PER_SECOND + BURST + JITTER_ALLOWANCE
    )
    assert "rate_limit_per_process" in worker[0].output()


async def test_each_route_has_its_own_rate_and_every_pair_arrives_once(settings, fleet, tmp_path, receiver):
    """A source with two `forward` routes (docs/reference.md §3 `routes`):
    each route's downstream gets no more than its own rate; every (event,
    route) pair arrives once, under its key KEY#ROUTE."""
    url, arrivals = receiver
    path = tmp_path / "s.toml"
    path.write_text(
        f'[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["{SECRET}"]\n'
        + "".join(
            f'[[sources.acme.routes]]\nname = "{route}"\nhandler = "forward"\n'
            f'handler_options = {{ url = "{url}", rate_limit = {{ per_second = {PER_SECOND} }} }}\n'
            for route in "ab"
        )
    )
    workers = [metered_worker(fleet, {"WEBHOOK_INGEST_SOURCES": str(path)}) for _ in range(2)]
    for worker, _ in workers:
        await wait_for_output(worker, "worker_consuming")
    events = [make_event("acme", f"evt_{n}") for n in range(EVENTS)]
    await publish_events(settings.amqp_url, settings.namespace, events)
    await until_completed(settings.database_url, 2 * EVENTS, timeout=60)

    assert {key: len(times) for key, times in arrivals.items()} == {
        f"{event.key}#{route}": 1 for event in events for route in "ab"
    }
    for route in "ab":
        times = [t for key, times in arrivals.items() if key.endswith(f"#{route}") for t in times]
        assert most_in_one_second(times) <= PER_SECOND + BURST + JITTER_ALLOWANCE
    assert await count_rows(settings.database_url, "dead_letters") == 0
