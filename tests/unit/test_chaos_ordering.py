"""`make chaos --ordering`'s own logic (tests/chaos/ordering.py): the plan is
a function of its seed, and `check_order` flags every inversion the design
forbids and allows only what it states (an external call of a holder
stopped past its lease)."""

import asyncio
import json
import time
from collections import Counter
from itertools import pairwise

import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.chaos.__main__ import main as chaos_main
from tests.chaos.checks import Observed, Verdict
from tests.chaos.downstream import Call
from tests.chaos.ordering import (
    VERSIONS,
    BlockedLane,
    Effect,
    Timing,
    Version,
    accepted_versions,
    check_order,
    make_ordered_plan,
    send_groups,
)
from tests.chaos.traffic import Sent
from tests.support.tcpproxy import free_port

NOT_STOPPED = Observed().stopped_at


def _version(n: int, sent: float, answered: float, obj: str = "obj_a") -> Version:
    return Version(obj, n, f"chaos:{obj}_v{n:03d}", sent, answered)


def _sequential(count: int, obj: str = "obj_a") -> list[Version]:
    """Versions 1..count, each sent a second after the one before was answered."""
    return [_version(n, 10.0 * n, 10.0 * n + 0.1, obj) for n in range(1, count + 1)]


def _in_order(versions: list[Version]) -> dict[str, list[Effect]]:
    """Each version's effect, having seen every earlier version of its object."""
    return {
        v.key: [Effect(100, frozenset(w.version for w in versions if w.obj == v.obj and w.version < v.version))]
        for v in versions
    }


def _calls(versions: list[Version], pid: int = 100) -> list[Call]:
    """One successful call per version, during its run (a second after it was answered)."""
    return [Call(v.key, pid, 1, v.answered + 1.0, v.answered + 1.1, 200, v.obj, v.version) for v in versions]


def _check(versions, effects, calls, stopped_at=NOT_STOPPED, blocked=(), may_block=frozenset()):
    verdict = Verdict()
    tally = check_order(versions, effects, calls, stopped_at, list(blocked), verdict, may_block=may_block)
    return [kind for kind, _ in verdict.violations], tally, verdict


def test_versions_run_in_order_are_no_violation_and_every_ordered_pair_is_checked():
    versions = _sequential(4)
    kinds, tally, _ = _check(versions, _in_order(versions), _calls(versions))
    assert kinds == []
    assert (tally.lanes, tally.pairs) == (1, 6)


def test_a_run_that_began_before_an_earlier_answered_version_committed_is_flagged_even_when_its_holder_was_stopped():
    versions = _sequential(3)
    effects = _in_order(versions)
    effects[versions[2].key] = [Effect(200, frozenset({1}))]  # version 3 ran before 2 had committed
    kinds, _, verdict = _check(versions, effects, _calls(versions), stopped_at=lambda pid, moment: True)
    assert kinds == ["ctx.db effects out of order"]
    assert "obj_a: version 3's run (pid 200) began before version 2's effect committed" in verdict.violations[0][1]


def test_versions_in_flight_together_have_no_order_to_keep():
    together = [_version(1, 10.0, 10.3), _version(2, 10.1, 10.2), _version(3, 20.0, 20.1)]
    effects = {
        together[0].key: [Effect(100, frozenset({2}))],  # 2 ran first: allowed, both were in flight
        together[1].key: [Effect(100, frozenset())],
        together[2].key: [Effect(100, frozenset({1, 2}))],
    }
    calls = _calls(together)
    calls[0] = Call(together[0].key, 100, 1, 12.0, 12.1, 200, "obj_a", 1)  # after version 2's call
    kinds, tally, _ = _check(together, effects, calls)
    assert kinds == []
    assert tally.pairs == 2  # (1, 3) and (2, 3)


def test_a_later_version_that_committed_while_an_earlier_one_never_did_is_out_of_order():
    versions = _sequential(2)
    effects = _in_order(versions)
    del effects[versions[0].key]
    effects[versions[1].key] = [Effect(100, frozenset())]
    assert _check(versions, effects, _calls(versions))[0] == ["ran past an unfinished version"]


def test_an_external_call_of_an_earlier_version_after_a_later_ones_is_flagged_unless_its_caller_was_stopped():
    versions = _sequential(2)
    calls = _calls(versions)
    late = Call(versions[0].key, 300, 1, calls[1].started + 0.5, calls[1].started + 0.6, 200, "obj_a", 1)
    kinds, _, verdict = _check(versions, _in_order(versions), [*calls, late])
    assert kinds == ["external calls out of order"]
    assert "a call of version 1 (pid 300) came 0.500s after version 2's first" in verdict.violations[0][1]

    seen = Observed()
    seen.stopped[300].append((calls[1].started - 3.0, calls[1].started + 0.2))  # stopped across that moment
    kinds, tally, _ = _check(versions, _in_order(versions), [*calls, late], stopped_at=seen.stopped_at)
    assert kinds == []
    assert tally.calls_inverted_while_stopped == 1

    other = Observed()
    other.stopped[999].append((calls[1].started - 3.0, calls[1].started + 0.2))  # another process's pause
    assert _check(versions, _in_order(versions), [*calls, late], stopped_at=other.stopped_at)[0] == [
        "external calls out of order"
    ]


def test_a_stopped_caller_is_excused_only_within_the_slack_after_it_woke():
    versions = _sequential(2)
    calls = _calls(versions)
    late = Call(versions[0].key, 300, 1, calls[1].started + 0.1, calls[1].started + 0.2, 200, "obj_a", 1)
    woke_just_before, woke_long_before = Observed(), Observed()
    woke_just_before.stopped[300].append((calls[1].started - 3.0, calls[1].started - 0.5))
    woke_long_before.stopped[300].append((calls[1].started - 9.0, calls[1].started - 5.0))
    assert _check(versions, _in_order(versions), [*calls, late], stopped_at=woke_just_before.stopped_at)[0] == []
    assert _check(versions, _in_order(versions), [*calls, late], stopped_at=woke_long_before.stopped_at)[0] == [
        "external calls out of order"
    ]


def test_failed_and_repeated_calls_of_an_earlier_version_before_the_later_ones_are_in_order():
    versions = _sequential(2)
    first, second = _calls(versions)
    failed = Call(first.key, 100, 1, first.started - 0.5, first.started - 0.4, 500, "obj_a", 1)
    again = Call(first.key, 200, 2, first.started + 0.05, first.started + 0.06, 200, "obj_a", 1)
    assert _check(versions, _in_order(versions), [failed, first, again, second])[0] == []


def test_a_later_versions_failed_call_counts_as_its_run_having_begun():
    versions = _sequential(2)
    first, second = _calls(versions)
    early = Call(second.key, 200, 1, first.started - 0.2, first.started - 0.1, 500, "obj_a", 2)
    assert _check(versions, _in_order(versions), [first, second, early])[0] == ["external calls out of order"]


def test_objects_are_judged_apart():
    a, b = _sequential(2, "obj_a"), _sequential(2, "obj_b")
    effects = _in_order(a) | _in_order(b)
    calls = _calls(a) + [Call(v.key, 100, 1, 1.0, 1.1, 200, v.obj, v.version) for v in b]  # obj_b's all early
    kinds, tally, _ = _check(a + b, effects, calls)
    assert kinds == []
    assert (tally.lanes, tally.pairs) == (2, 2)


def test_a_blocked_lane_is_reported_and_a_violation_unless_a_version_of_it_was_told_to_fail_for_good():
    versions = _sequential(2)
    blocked = [BlockedLane("chaos:obj_a", 7, 42.0, 1)]
    kinds, tally, verdict = _check(versions, _in_order(versions), _calls(versions), blocked=blocked)
    assert kinds == ["lane blocked"]
    assert "chaos:obj_a: blocked by dead letter 7 for 42s, 1 waiting" in verdict.violations[0][1]
    assert "blocked    1 lane(s): chaos:obj_a by dead letter 7 for 42s, 1 waiting" in tally.lines()
    kinds, _, _ = _check(versions, _in_order(versions), _calls(versions), blocked=blocked, may_block={"chaos:obj_a"})
    assert kinds == []


@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_a_seed_gives_one_plan_of_every_version_of_every_object_in_groups_in_order(seed):
    ordered = make_ordered_plan(seed, events=50, duration=10)
    assert ordered == make_ordered_plan(seed, events=50, duration=10)
    assert len(ordered.groups) == 5
    for obj, groups in ordered.groups.items():
        numbers = [json.loads(r.body)["version"] for group in groups for r in group]
        assert numbers == list(range(1, VERSIONS + 1))
        assert all(json.loads(r.body)["object"] == obj for group in groups for r in group)
        assert all(1 <= len(group) <= 3 for group in groups)
        starts = [group[0].at for group in groups]
        assert starts == sorted(starts)
    assert not any(event.expect_dead_letter for event in ordered.plan.events)  # a dead letter would block its lane
    assert all(0 < fault.at < 10 for fault in ordered.plan.faults)
    assert not any(fault.action in ("replay", "dlq-replay") for fault in ordered.plan.faults)
    assert Counter(event.kind for event in ordered.plan.events) == {"ordered": 50}


def test_only_accepted_versions_are_judged_each_with_its_timing():
    ordered = make_ordered_plan(1, events=10, duration=5)
    [first, second, *_] = [r.event_id for group in ordered.groups["obj_0000"] for r in group]
    sent = Sent()
    sent.accepted[first] = f"chaos:{first}"
    timings = {first: Timing(1.0, 1.2), second: Timing(2.0, 2.1)}  # the second answered, not 200
    assert accepted_versions(ordered, sent, timings) == [Version("obj_0000", 1, f"chaos:{first}", 1.0, 1.2)]


async def test_a_group_goes_only_once_every_answer_of_the_one_before_came_back_and_a_503_is_retried():
    """The sender keeps the plan's promise: a version sent after the previous
    group's answers; its timing from the first attempt (a 503 retried)."""
    received: list[tuple[int, float]] = []
    in_flight = Counter()

    async def answer(request: web.Request) -> web.Response:
        payload = json.loads(await request.read())
        received.append((payload["version"], time.time()))
        in_flight[payload["version"]] += 1
        if in_flight[payload["version"]] == 1 and payload["version"] == 2:
            return web.json_response({"error": "unavailable"}, status=503)
        await asyncio.sleep(0.05)
        return web.json_response({"status": "accepted", "key": f"chaos:{payload['id']}"})

    app = web.Application()
    app.router.add_post("/webhooks/chaos", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        ordered = make_ordered_plan(3, events=10, duration=0.5)
        groups = ordered.groups["obj_0000"]
        sent, timings = await send_groups(f"http://127.0.0.1:{port}", "chaos", "secret", ordered)
    finally:
        await runner.cleanup()
    assert len(sent.accepted) == VERSIONS
    assert in_flight[2] == 2  # the 503 was tried again
    by_version = {version: at for version, at in received}
    for before, after in pairwise(groups):
        answered = max(timings[r.event_id].answered for r in before)
        assert all(by_version[json.loads(r.body)["version"]] >= answered for r in after)
    second = next(r.event_id for group in groups for r in group if json.loads(r.body)["version"] == 2)
    assert timings[second].sent < min(at for version, at in received if version == 2) + 0.01  # the first attempt's


def test_the_command_refuses_what_an_ordering_run_would_not_honour(capsys):
    assert chaos_main(["--ordering", "--url", "http://127.0.0.1:1"]) == 2
    assert chaos_main(["--ordering", "--routes", "a,b"]) == 2
    assert "--routes cannot be given with it" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        chaos_main(["--ordering", "--ordering-off"])
