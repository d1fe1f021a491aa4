"""The lane runner over an in-memory lane store (tests/support/in_memory.py,
InMemoryLanes) and a stand-in for the ordered rows' Processor: rows in
order, a row inserted while the holder drains, capacity, pauses, a stop
within its grace, a retry letting the lane go, a lost lane cancelling its
running row, the watchdog's timers."""

import asyncio

import pytest

from tests.support.events import make_event
from tests.support.in_memory import InMemoryLanes
from webhook_ingest.shared.event import EventMessage
from webhook_ingest.shared.ordering import ordered_row
from webhook_ingest.shared.sources.model import load_sources
from webhook_ingest.workers.claim import Outcome
from webhook_ingest.workers.ordering import LaneRunner
from webhook_ingest.workers.ordering import runner as runner_module
from webhook_ingest.workers.ordering.store import PendingRow


@pytest.fixture
def sources(tmp_path):
    path = tmp_path / "sources.toml"
    path.write_text(
        '[sources.acme]\nscheme = "hmac-sha256"\nsecrets = ["s"]\n'
        'handler = "tests.support.ordering_handlers:record_version"\n'
        '[sources.acme.ordering]\nkey = "body:object"\n'
    )
    return load_sources(str(path))


def unordered_sources(tmp_path):
    """acme and other, neither ordered (ordering removed from the file, or never there)."""
    path = tmp_path / "unordered.toml"
    path.write_text(
        "".join(
            f'[sources.{name}]\nscheme = "hmac-sha256"\nsecrets = ["s"]\n'
            'handler = "tests.support.ordering_handlers:record_version"\n'
            for name in ("acme", "other")
        )
    )
    return load_sources(str(path))


def pending(seq: int, lane: str = "acme:a") -> PendingRow:
    row = ordered_row(make_event("acme", f"{lane}-{seq}"), lane, None)
    return PendingRow(seq, None, row.body, row.amqp_headers, 1, 0, (), 0)


class Rows:
    """The ordered rows' Processor: records each run, completes it (the lane's advance) unless told otherwise."""

    def __init__(self, lanes: InMemoryLanes):
        self.lanes = lanes
        self.ran: list[tuple[str, int]] = []
        self.outcomes: dict[tuple[str, int], Outcome] = {}
        self.pause = 0.0
        self.on_run = None

    async def run(self, message: EventMessage) -> Outcome:
        step = message.ordered
        assert step is not None
        self.ran.append((step.lane, step.seq))
        if self.on_run is not None:
            self.on_run(step)
        await asyncio.sleep(self.pause)
        outcome = self.outcomes.get((step.lane, step.seq), Outcome.PROCESSED)
        if outcome is Outcome.PROCESSED:
            assert self.lanes.advance(step.lane, step.token, step.seq)
        return outcome


def runner(lanes, rows, sources, paused=(), capacity=8, ttl_ms=3000):
    settled: list[tuple[str, Outcome]] = []
    made = LaneRunner(
        lanes,
        rows.run,
        sources,
        set(paused),
        holder="w1",
        capacity=capacity,
        ttl_ms=ttl_ms,
        settled=lambda event, outcome, _: settled.append((event.key, outcome)),
    )
    return made, settled


async def until_idle(made: LaneRunner, timeout: float = 5) -> None:
    async with asyncio.timeout(timeout):
        while made.held():  # noqa: ASYNC110 - the runner has no event to wait on: polled
            await asyncio.sleep(0.01)


async def test_a_lanes_rows_run_in_order_then_the_lane_is_let_go(sources):
    lanes = InMemoryLanes()
    lanes.add("acme:a", *(pending(seq) for seq in range(1, 6)))
    rows = Rows(lanes)
    made, settled = runner(lanes, rows, sources)
    made.offer("acme:a")
    made.offer("acme:a")  # held already: nothing more
    await until_idle(made)
    assert rows.ran == [("acme:a", seq) for seq in range(1, 6)]
    assert [outcome for _, outcome in settled] == [Outcome.PROCESSED] * 5
    assert lanes.released == ["acme:a"] and lanes.lanes["acme:a"].holder is None


async def test_a_row_inserted_while_the_holder_drains_runs_before_it_lets_go(sources):
    lanes = InMemoryLanes()
    lanes.add("acme:a", pending(1))
    rows = Rows(lanes)
    rows.on_run = lambda step: lanes.add("acme:a", pending(step.seq + 1)) if step.seq < 3 else None
    made, _ = runner(lanes, rows, sources)
    made.offer("acme:a")
    await until_idle(made)
    assert rows.ran == [("acme:a", 1), ("acme:a", 2), ("acme:a", 3)]
    assert lanes.released == ["acme:a"]  # once, at the end


async def test_a_runner_holds_at_most_its_capacity_of_lanes(sources):
    lanes = InMemoryLanes()
    for name in ("acme:a", "acme:b", "acme:c"):
        lanes.add(name, pending(1, name))
    rows = Rows(lanes)
    rows.pause = 0.05
    made, _ = runner(lanes, rows, sources, capacity=2)
    for name in ("acme:a", "acme:b", "acme:c"):
        made.offer(name)
    assert made.held() == 2
    await until_idle(made)
    assert sorted(lane for lane, _ in rows.ran)[:2] == ["acme:a", "acme:b"]
    await asyncio.sleep(0.1)  # a freed slot looks at once: the third is taken without the watchdog
    await until_idle(made)
    assert ("acme:c", 1) in rows.ran
    assert await made.look() == 0  # nothing left for the watchdog


async def test_lanes_offered_while_full_are_taken_in_order_as_slots_free_without_a_look(sources):
    lanes = InMemoryLanes()
    names = [f"acme:{n}" for n in range(5)]
    for name in names:
        lanes.add(name, pending(1, name))
    looks = []
    runnable = lanes.runnable

    async def counted(*args, **kwargs):
        looks.append(args)
        return await runnable(*args, **kwargs)

    lanes.runnable = counted  # type: ignore[method-assign]
    rows = Rows(lanes)
    rows.pause = 0.01
    made, _ = runner(lanes, rows, sources, capacity=1)
    for name in names:
        made.offer(name)
    assert made.held() == 1
    await asyncio.sleep(0.3)
    await until_idle(made)
    assert rows.ran == [(name, 1) for name in names]
    assert looks == []  # each freed slot took the next lane offered, no statement to find it


async def test_a_paused_or_unknown_sources_lane_is_not_taken(sources):
    lanes = InMemoryLanes()
    lanes.add("acme:a", pending(1))
    lanes.add("other:b", pending(1, "other:b"))
    rows = Rows(lanes)
    made, _ = runner(lanes, rows, sources, paused={"acme"})
    made.offer("acme:a")
    made.offer("other:b")
    assert made.held() == 0
    assert await made.look() == 0


async def test_a_pause_lets_the_lane_go_after_the_running_row(sources):
    lanes = InMemoryLanes()
    lanes.add("acme:a", *(pending(seq) for seq in range(1, 4)))
    rows = Rows(lanes)
    paused: set[str] = set()
    rows.on_run = lambda step: paused.add("acme")
    made = LaneRunner(lanes, rows.run, sources, paused, "w1", 8, 3000, lambda *_: None)
    made.offer("acme:a")
    await until_idle(made)
    assert rows.ran == [("acme:a", 1)]
    assert [row.seq for row in lanes.lanes["acme:a"].rows] == [2, 3]
    assert lanes.lanes["acme:a"].holder is None  # let go: on resume the watchdog finds it


async def test_a_stop_lets_each_lane_go_after_its_running_row(sources):
    lanes = InMemoryLanes()
    lanes.add("acme:a", *(pending(seq) for seq in range(1, 4)))
    rows = Rows(lanes)
    rows.pause = 0.2
    made, _ = runner(lanes, rows, sources)
    made.offer("acme:a")
    await asyncio.sleep(0.05)
    await made.stop(grace_seconds=5)
    assert rows.ran == [("acme:a", 1)]
    assert lanes.lanes["acme:a"].holder is None
    made.offer("acme:a")
    assert made.held() == 0  # stopping: nothing taken


async def test_a_stop_past_its_grace_cancels_the_row_and_lets_the_lane_go(sources):
    lanes = InMemoryLanes()
    lanes.add("acme:a", pending(1))
    rows = Rows(lanes)
    rows.pause = 10
    made, _ = runner(lanes, rows, sources)
    made.offer("acme:a")
    await asyncio.sleep(0.05)
    await made.stop(grace_seconds=0.1)
    assert made.held() == 0
    assert lanes.lanes["acme:a"].holder is None and [row.seq for row in lanes.lanes["acme:a"].rows] == [1]


@pytest.mark.parametrize("outcome", [Outcome.RETRIED, Outcome.DEFERRED, Outcome.DEAD])
async def test_a_retry_a_deferral_or_a_blocking_dead_letter_lets_the_lane_go(sources, outcome):
    lanes = InMemoryLanes()
    lanes.add("acme:a", pending(1), pending(2))
    rows = Rows(lanes)
    rows.outcomes[("acme:a", 1)] = outcome
    made, _ = runner(lanes, rows, sources)
    made.offer("acme:a")
    await until_idle(made)
    assert rows.ran == [("acme:a", 1)]
    assert lanes.lanes["acme:a"].holder is None


async def test_a_row_done_elsewhere_is_finished_and_the_lane_goes_on(sources):
    lanes = InMemoryLanes()
    lanes.add("acme:a", pending(1), pending(2))
    rows = Rows(lanes)
    rows.outcomes[("acme:a", 1)] = Outcome.DUPLICATE
    made, _ = runner(lanes, rows, sources)
    made.offer("acme:a")
    await until_idle(made)
    assert rows.ran == [("acme:a", 1), ("acme:a", 2)]
    assert lanes.lanes["acme:a"].rows == []


async def test_a_lane_lost_while_its_row_runs_cancels_the_row(sources):
    """Another took the lane (its token changed): the renewal is refused, the
    Keeper asks once more, and the running row is cancelled."""
    lanes = InMemoryLanes()
    lanes.add("acme:a", pending(1), pending(2))
    rows = Rows(lanes)
    rows.pause = 5
    made, _ = runner(lanes, rows, sources, ttl_ms=300)
    made.offer("acme:a")
    await asyncio.sleep(0.05)
    lanes.lanes["acme:a"].token += 100  # taken over
    await until_idle(made, timeout=2)
    assert rows.ran == [("acme:a", 1)]
    assert [row.seq for row in lanes.lanes["acme:a"].rows] == [1, 2]


async def test_the_watchdog_arms_a_timer_at_the_wait_it_is_told(sources):
    lanes = InMemoryLanes()
    lanes.add("acme:a", pending(1))
    lanes.lanes["acme:a"].ready_at = asyncio.get_running_loop().time() + 0.3
    rows = Rows(lanes)
    made, _ = runner(lanes, rows, sources)
    assert await made.look() == 1
    assert await made.look() == 0  # armed already
    await asyncio.sleep(0.2)
    assert rows.ran == []
    await asyncio.sleep(0.2)
    await until_idle(made)
    assert rows.ran == [("acme:a", 1)]


async def test_a_head_past_the_delivery_limit_is_dead_lettered_unrun(sources):
    lanes = InMemoryLanes()
    poisoned = pending(1)
    lanes.add("acme:a", PendingRow(1, None, poisoned.body, poisoned.amqp_headers, 1, 0, (), 3), pending(2))
    rows = Rows(lanes)
    dead: list[tuple[int, str]] = []

    async def dead_unrun(message, source, error):
        dead.append((message.ordered.seq, error["type"]))
        lanes.lanes["acme:a"].rows.pop(0)  # skipped (on_dead_letter = "skip" would go on; block lets go)
        return Outcome.DEAD

    made = LaneRunner(
        lanes, rows.run, sources, set(), "w1", 8, 3000, lambda *_: None, dead_unrun=dead_unrun, delivery_limit=2
    )
    made.offer("acme:a")
    await until_idle(made)
    assert dead == [(1, "DeliveryLimitExceeded")]
    assert rows.ran == []  # blocks (the default): the lane let go, row 2 waits


class PagedRows(Rows):
    """Rows whose page's leases are taken at once (Processor.lease_rows and its friends)."""

    def __init__(self, lanes: InMemoryLanes):
        super().__init__(lanes)
        self.leased: list[list[str]] = []
        self.given_back: list[str] = []
        self.ran_leased: list[int] = []

    async def lease_rows(self, keys):
        from webhook_ingest.workers.claim import Lease

        self.leased.append(keys)
        return {key: Lease(key, 1, 0.0) for key in keys}, {}

    async def run_leased(self, message, lease, completed_sha256):
        self.ran_leased.append(message.ordered.seq)
        return await self.run(message)

    async def release_leases(self, leases):
        self.given_back.extend(lease.key for lease in leases)

    def lease_keeper(self, leases):
        from webhook_ingest.workers.claim import Keeper

        async def renew():
            return True

        return Keeper("page", renew, 3.0)


async def test_a_pages_rows_run_under_the_leases_taken_for_the_page(sources):
    lanes = InMemoryLanes()
    lanes.add("acme:a", *(pending(seq) for seq in range(1, 4)))
    rows = PagedRows(lanes)
    made = LaneRunner(lanes, rows.run, sources, set(), "w1", 8, 3000, lambda *_: None, pages=rows)
    made.offer("acme:a")
    await until_idle(made)
    assert rows.leased == [["acme:acme:a-1", "acme:acme:a-2", "acme:acme:a-3"]]
    assert rows.ran_leased == [1, 2, 3] and rows.given_back == []


async def test_a_page_stopped_early_gives_its_unused_leases_back(sources):
    lanes = InMemoryLanes()
    lanes.add("acme:a", *(pending(seq) for seq in range(1, 4)))
    rows = PagedRows(lanes)
    rows.outcomes[("acme:a", 1)] = Outcome.RETRIED
    made = LaneRunner(lanes, rows.run, sources, set(), "w1", 8, 3000, lambda *_: None, pages=rows)
    made.offer("acme:a")
    await until_idle(made)
    assert rows.ran_leased == [1]
    assert sorted(rows.given_back) == ["acme:acme:a-2", "acme:acme:a-3"]


async def test_the_watchdog_of_a_worker_with_nothing_ordered_sends_no_statement(tmp_path):
    """No source here is ordered and no lane holds rows: the first look asks
    once which sources still have lanes with rows (none), then no look sends
    a statement."""
    lanes = InMemoryLanes()
    made, _ = runner(lanes, Rows(lanes), unordered_sources(tmp_path))
    for _ in range(5):
        assert await made.look() == 0
    assert lanes.looks == 1


async def test_a_lane_offered_to_a_worker_with_nothing_ordered_is_watched_until_asked_again(tmp_path, monkeypatch):
    """A lane of a source no longer ordered, taken on a wake-up after the
    first look: the watchdog looks for its source's lanes from the next look
    (a retry's delay is come back to), until the leftovers' question, asked
    again after LEFTOVERS_SECONDS, finds none of its lanes with rows."""
    lanes = InMemoryLanes()
    rows = Rows(lanes)
    made, _ = runner(lanes, rows, unordered_sources(tmp_path))
    assert await made.look() == 0
    assert lanes.looks == 1  # the leftovers' question: none
    lanes.add("acme:a", pending(1))
    made.offer("acme:a")
    await until_idle(made)
    assert await made.look() == 0
    assert lanes.looks == 2 and made._watched == {"acme"}  # one `runnable`, for acme
    monkeypatch.setattr(runner_module, "LEFTOVERS_SECONDS", 0.0)
    assert await made.look() == 0
    assert lanes.looks == 3 and made._watched == frozenset()  # asked again: acme drained
    monkeypatch.undo()
    for _ in range(3):
        assert await made.look() == 0
    assert lanes.looks == 3


async def test_the_watchdog_of_ordered_sources_only_asks_for_their_lanes(sources):
    lanes = InMemoryLanes()
    made, _ = runner(lanes, Rows(lanes), sources)
    for _ in range(3):
        assert await made.look() == 0
    assert lanes.looks == 3  # one `runnable` a look, no question about leftovers


async def test_the_lanes_a_source_held_when_its_ordering_was_removed_still_drain(tmp_path):
    """acme's lane held rows when the worker started with a file that no
    longer orders acme: the watchdog looks for acme's lanes, and they run;
    other, with no lane, is not looked for."""
    lanes = InMemoryLanes()
    lanes.add("acme:a", pending(1), pending(2))
    rows = Rows(lanes)
    made, _ = runner(lanes, rows, unordered_sources(tmp_path))
    assert await made.look() == 1
    await asyncio.sleep(0.1)
    await until_idle(made)
    assert rows.ran == [("acme:a", 1), ("acme:a", 2)]
    assert made._watched == {"acme"}
