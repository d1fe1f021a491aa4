"""The fault run's re-run checks (tests/chaos/reruns.py, issue 35): a key
the downstream answered twice is a violation unless the record shows a
fault that took the key from its first caller; pauses and replays are
drawn from the seed without changing what it drew before."""

from collections import Counter

from tests.chaos.applied import Applied
from tests.chaos.checks import Verdict
from tests.chaos.downstream import Call
from tests.chaos.plan import make_plan
from tests.chaos.reruns import GaveUp, Reruns, Run, count_reruns, judge_calls

KEY = "chaos:evt_1#ledger"
FIRST, SECOND, THIRD = 101, 202, 303  # three worker processes
WORKERS = {FIRST: "worker 0", SECOND: "worker 1", THIRD: "worker 2"}


def _called(*calls: tuple[int, float]) -> dict[str, list[Call]]:
    return {KEY: [Call(KEY, pid, 1, at, at + 0.3, 200) for pid, at in calls]}


def _runs(*runs: tuple[int, float]) -> dict[str, list[Run]]:
    return {KEY: [Run(pid, 1, at, at + 0.5) for pid, at in runs]}


def _judged(calls, runs, applied, prunes=(), gave_up=None) -> tuple[list[str], Reruns]:
    verdict, tally = Verdict(), Reruns()
    judge_calls(calls, runs, applied, list(prunes), WORKERS, verdict, tally, gave_up, lock_ttl=3.0)
    return [kind for kind, _ in verdict.violations], tally


def test_one_successful_call_is_no_violation():
    assert _judged(_called((FIRST, 10.2)), _runs((FIRST, 10.0)), []) == ([], Reruns())


def test_a_second_successful_call_with_no_fault_between_is_a_violation():
    kinds, _ = _judged(_called((FIRST, 10.2), (SECOND, 14.2)), _runs((FIRST, 10.0), (SECOND, 14.0)), [])
    assert kinds == ["call repeated"]


def test_a_kill_of_the_first_caller_explains_the_second_call_even_stamped_after_it():
    killed = Applied("kill", 10.1, 10.1, worker=0, pid=FIRST)  # the call reached the downstream's loop after
    kinds, tally = _judged(_called((FIRST, 10.2), (SECOND, 14.2)), _runs((FIRST, 10.0), (SECOND, 14.0)), [killed])
    assert kinds == [] and tally.calls_repeated == Counter({"kill": 1})


def test_a_kill_of_another_worker_explains_nothing():
    killed = Applied("kill", 12.0, 12.0, worker=1, pid=SECOND)
    kinds, _ = _judged(_called((FIRST, 10.2), (SECOND, 14.2)), _runs((FIRST, 10.0), (SECOND, 11.0)), [killed])
    assert kinds == ["call repeated"]


def test_a_pause_explains_a_call_by_another_worker_that_started_the_key_meanwhile():
    paused = Applied("pause", 10.5, 14.0, worker=0, pid=FIRST)
    kinds, tally = _judged(_called((FIRST, 10.2), (SECOND, 13.6)), _runs((FIRST, 10.0), (SECOND, 13.4)), [paused])
    assert kinds == [] and tally.calls_repeated == Counter({"pause": 1})


def test_a_paused_worker_calling_past_the_round_trip_after_it_woke_is_a_violation():
    """Woken, it called while the other's run was going, past the time its
    lease's confirmation takes: two runs at once."""
    paused = Applied("pause", 10.5, 14.0, worker=0, pid=FIRST)
    kinds, _ = _judged(_called((SECOND, 13.6), (FIRST, 15.5)), _runs((FIRST, 10.0), (SECOND, 13.4)), [paused])
    assert kinds == ["call repeated"]


def test_a_paused_worker_calling_as_it_wakes_is_the_pause_s_known_limit():
    """CI-like run of seed 7 (13:18 UTC): worker 0 stopped 3.2 s at a 3 s
    TTL with evt_00087 in hand, worker 1 took the lapsed key, and worker 0's
    handler called 79 ms after waking, before its keeper's question to
    Postgres came back; either call may reach the downstream first."""
    paused = Applied("pause", 10.5, 14.0, worker=0, pid=FIRST)
    for calls in (((FIRST, 14.08), (SECOND, 14.1)), ((SECOND, 13.6), (FIRST, 14.08))):
        kinds, tally = _judged(_called(*calls), _runs((FIRST, 10.0), (SECOND, 12.8)), [paused])
        assert kinds == [] and tally.calls_repeated == Counter({"pause": 1})


def test_a_pause_the_other_run_did_not_start_in_explains_nothing():
    paused = Applied("pause", 10.5, 11.0, worker=0, pid=FIRST)  # under the TTL: nobody could take the key
    kinds, _ = _judged(_called((FIRST, 10.2), (SECOND, 14.2)), _runs((FIRST, 10.0), (SECOND, 14.0)), [paused])
    assert kinds == ["call repeated"]


# Seed 7 on a quiet host: worker 0 stopped 2.6 s, awake 0.35 s (its call went out then), stopped
# 2.6 s again (the plan's pauses at 44.06 s and 47.02 s, applied as below); its lease ran out while
# it stood still and worker 2 called again, its run begun more than the 1 s slack after worker 0
# woke (its copy deferred while the lease held, TurnTaken). Here 1.15 s after, and the refusal
# that says worker 2 took the lease before worker 0's confirmation landed 1.25 s after: that
# run's record is gone, these two figures stand for it.
STOPPED_TWICE = [Applied("pause", 44.14, 46.74, worker=0, pid=FIRST), Applied("pause", 47.10, 49.70, 0, FIRST)]
CALLED_IN_THE_GAP = _called((FIRST, 46.90), (THIRD, 51.00))
TAKEN_AFTER_THE_WAKE = _runs((FIRST, 43.90), (THIRD, 50.85))


def test_a_lease_taken_from_a_worker_stopped_twice_explains_the_call_after_its_refusal():
    refused = {(FIRST, KEY): [GaveUp(50.95, "refused")]}
    kinds, tally = _judged(CALLED_IN_THE_GAP, TAKEN_AFTER_THE_WAKE, STOPPED_TWICE, gave_up=refused)
    assert kinds == [] and tally.calls_repeated == Counter({"pause": 1})


def test_the_same_timeline_without_the_refusal_is_still_a_violation():
    """Measured from the wake, as before: the taker's run began too late to be the pause's."""
    assert _judged(CALLED_IN_THE_GAP, TAKEN_AFTER_THE_WAKE, STOPPED_TWICE)[0] == ["call repeated"]


def test_a_lease_given_up_unanswered_after_a_pause_explains_nothing():
    """No one had taken the key: the holder gave up a lease Postgres would have confirmed, and the
    run after it repeated the call — a bug, named with why the lease was given up."""
    for because in ("unanswered", ""):  # "": a log line from before `lost` was logged
        unanswered = {(FIRST, KEY): [GaveUp(50.95, because)]}
        kinds, _ = _judged(CALLED_IN_THE_GAP, TAKEN_AFTER_THE_WAKE, STOPPED_TWICE, gave_up=unanswered)
        assert kinds == ["call repeated after a lease given up"]


def test_a_refusal_no_other_run_began_before_explains_nothing():
    """Refused, yet no run of another process began between the pause and the refusal: the take is
    not in the record, and the later run came well after."""
    refused = {(FIRST, KEY): [GaveUp(50.95, "refused")]}
    late = _runs((FIRST, 43.90), (THIRD, 52.50))
    kinds, _ = _judged(_called((FIRST, 46.90), (THIRD, 52.60)), late, STOPPED_TWICE, gave_up=refused)
    assert kinds == ["call repeated after a lease given up"]


def test_a_refusal_later_than_a_woken_holder_s_confirmation_takes_explains_nothing():
    """Past the TTL a woken holder's confirmation may take: the lease was lost to something else."""
    refused = {(FIRST, KEY): [GaveUp(54.00, "refused")]}
    runs = _runs((FIRST, 43.90), (THIRD, 53.90))
    kinds, _ = _judged(_called((FIRST, 46.90), (THIRD, 54.05)), runs, STOPPED_TWICE, gave_up=refused)
    assert kinds == ["call repeated after a lease given up"]


def test_a_postgres_cut_explains_a_second_call_but_a_redis_cut_does_not():
    cut = Applied("cut", 10.3, 13.0, worker=0, pid=FIRST, service="postgres")
    calls, runs = _called((FIRST, 10.2), (SECOND, 14.2)), _runs((FIRST, 10.0), (SECOND, 14.0))
    assert _judged(calls, runs, [cut])[0] == []
    assert _judged(calls, runs, [Applied("cut", 10.3, 13.0, 0, FIRST, "redis")])[0] == ["call repeated"]


def test_an_attempt_run_again_is_counted_under_the_fault_on_the_earlier_run():
    tally = Reruns()
    count_reruns(_runs((FIRST, 10.0), (SECOND, 14.0)), [Applied("kill", 10.2, 10.2, 0, FIRST)], [], set(), tally)
    assert tally.runs_repeated == Counter({"kill": 1}) and tally.extra_runs == Counter({"kill": 1})


def test_what_issue_35_draws_leaves_the_seeds_earlier_plan_as_it_was():
    """Seed 7's first faults and its traffic, as make_plan drew them before
    pauses, hogs, replays and the downstream's directives were added."""
    plan = make_plan(7, events=100, duration=30)
    earlier = [
        (round(f.at, 3), f.action, f.worker, f.service, round(f.seconds, 3))
        for f in plan.faults
        if f.action in ("kill", "cut", "flush", "prune")
    ]
    assert earlier[:4] == [
        (1.844, "cut", 2, "postgres", 1.887),
        (2.359, "cut", 1, "redis", 2.456),
        (2.433, "cut", 2, "postgres", 1.089),
        (2.437, "cut", 0, "redis", 2.429),
    ]
    assert (len(plan.requests), round(plan.requests[0].at, 4)) == (255, 0.1319)
    kinds = Counter(fault.action for fault in plan.faults)
    assert kinds["replay"] == 1 and kinds["dlq-replay"] == 1 and kinds["hog"] >= 1
    assert all(0.5 <= fault.seconds <= 3.6 for fault in plan.faults if fault.action == "pause")


def test_a_woken_holder_refused_its_lease_may_call_again_when_the_key_comes_back_to_it():
    """Two fresh-clone CIs of seed 7 with routes (00:09, 00:18 UTC, 2026-11-30): worker 2 stopped
    2.4 s at a 3 s TTL (its last renewal up to 1 s before), another worker took the lapsed key, the
    woken handler's call landed 76 ms before Postgres's refusal came back (design.md's stated
    limit), and the key, its taker deferred, came back to worker 2, whose next run called again."""
    paused = Applied("pause", 34.94, 37.34, worker=2, pid=THIRD)
    refused = {(THIRD, KEY): [GaveUp(37.45, "refused")]}
    runs = _runs((THIRD, 34.00), (SECOND, 36.50), (THIRD, 38.70))
    kinds, tally = _judged(_called((THIRD, 37.43), (THIRD, 38.81)), runs, [paused], gave_up=refused)
    assert kinds == [] and tally.calls_repeated == Counter({"pause": 1})


def test_a_woken_holder_s_own_later_call_without_a_take_is_still_a_violation():
    paused = Applied("pause", 34.94, 37.34, worker=2, pid=THIRD)
    refused = {(THIRD, KEY): [GaveUp(37.45, "refused")]}
    runs = _runs((THIRD, 34.00), (THIRD, 38.70))  # no other process's run: no take in the record
    kinds, _ = _judged(_called((THIRD, 37.43), (THIRD, 38.81)), runs, [paused], gave_up=refused)
    assert kinds == ["call repeated after a lease given up"]
