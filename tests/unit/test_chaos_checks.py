"""The fault run's own logic (tests/chaos): the plan is a function of its
seed, and the verdict flags what it must and allows what the contract
allows (a repeat after prune)."""

import json
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.chaos.checks import Observed, judge
from tests.chaos.plan import PlannedEvent, make_plan
from tests.chaos.queues import described
from tests.chaos.replays import IssuedReplay, ReplaysSeen, judge_event_replays
from tests.chaos.traffic import Sent

KEY = "chaos:evt_1"


def _accepted(event_id: str = "evt_1", variants=(0,)) -> Sent:
    sent = Sent()
    sent.accepted[event_id] = f"chaos:{event_id}"
    sent.accepted_variants[event_id] = set(variants)
    sent.answers[event_id] = {"200 accepted": len(variants)}
    return sent


def _completed_once(**runs) -> Observed:
    seen = Observed()
    seen.effects[KEY] = [(10.5, 10.0)]
    seen.inbox = {KEY}
    seen.runs[KEY] = runs.get("runs", [(10.0, 10.4, 1)])
    return seen


def _kinds(events, sent, seen, prunes=()) -> list[str]:
    return [kind for kind, _ in judge(events, sent, seen, list(prunes), {}).violations]


@settings(max_examples=20, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_a_seed_gives_one_plan_whose_bodies_are_json_and_whose_faults_fit_the_duration(seed):
    plan = make_plan(seed, events=30, duration=10)
    assert plan == make_plan(seed, events=30, duration=10)
    for request in plan.requests:
        assert json.loads(request.body)["id"] == request.event_id
    assert all(0 < fault.at < 10 for fault in plan.faults)
    assert not any(f.service == "redis" and f.worker == 2 for f in plan.faults)  # the degraded worker has none


def test_one_effect_and_one_run_is_no_violation():
    assert _kinds([PlannedEvent("evt_1", "", "plain")], _accepted(), _completed_once()) == []


def test_two_runs_of_one_key_that_overlap_are_flagged():
    seen = _completed_once(runs=[(10.0, 10.4, 1), (10.3, 10.45, 2)])
    assert _kinds([PlannedEvent("evt_1", "", "plain")], _accepted(), seen) == ["two runs at once"]


def test_a_second_effect_is_a_violation_unless_a_prune_could_have_forgotten_the_first():
    seen = _completed_once(runs=[(10.0, 10.4, 1), (20.0, 20.4, 2)])
    seen.effects[KEY].append((20.5, 20.0))
    event = PlannedEvent("evt_1", "", "plain")
    assert _kinds([event], _accepted(), seen) == ["effect repeated", "ran after completion"]
    assert _kinds([event], _accepted(), seen, prunes=[(15.0, 16.0)]) == []
    assert _kinds([event], _accepted(), seen, prunes=[(10.2, 10.9)]) != []  # the first was not yet past the window


def test_a_key_told_to_fail_for_good_must_be_one_open_dead_letter():
    event = PlannedEvent("evt_1", "permanent", "plain")
    assert _kinds([event], _accepted(), _completed_once()) == ["missing dead letter"]
    seen = Observed()
    seen.open_dead_letters[KEY] = ["PermanentError"]
    seen.runs[KEY] = [(10.0, 10.4, 1)]
    assert _kinds([event], _accepted(), seen) == []
    seen.open_dead_letters[KEY].append("PermanentError")
    assert _kinds([event], _accepted(), seen) == ["several open dead letters"]


def test_an_accepted_key_with_nothing_to_show_is_lost():
    seen = Observed()
    seen.runs[KEY] = [(10.0, 10.4, 1)]
    assert _kinds([PlannedEvent("evt_1", "", "plain")], _accepted(), seen) == ["lost"]


def test_two_accepted_payloads_need_a_recorded_conflict():
    event = PlannedEvent("evt_1", "", "conflict")
    seen = _completed_once()
    assert _kinds([event], _accepted(variants=(0, 1)), seen) == ["conflict not recorded"]
    seen.conflicts = {KEY}
    assert _kinds([event], _accepted(variants=(0, 1)), seen) == []


def test_a_lone_surrogate_must_be_refused_at_the_door():
    event = PlannedEvent("evt_1", "", "unstorable")
    refused = Sent(answers={"evt_1": {"400 invalid_json": 1}})
    assert _kinds([event], refused, Observed()) == []
    assert "unstorable body accepted" in _kinds([event], _accepted(), _completed_once())


def test_a_message_left_in_a_queue_is_named_by_its_queue_key_headers_and_what_postgres_holds_of_it():
    """Issue 35 #4: "a message was still in the deployment's queues" must say which one."""
    event = PlannedEvent("evt_1", "", "plain")
    headers = {
        "x-key": b"chaos:evt_1",
        "x-attempt": 2,
        "x-arrival": 77,
        "x-delivery-count": 3,
        "x-death": [{"queue": "ns.retry.0.5s", "reason": "expired", "count": 1}],
    }
    left = {"ns.events": [described(headers, message_id="m-1")]}
    [(kind, detail)] = judge([event], _accepted(), _completed_once(), [], {"ns.events": 1}, (), left).violations
    assert kind == "left in a queue"
    assert detail == (
        "1 message(s) in ns.events after the workers stopped; chaos:evt_1 (completed): attempt 2, "
        "arrival 77, delivery-count 3, died in ns.retry.0.5s (expired x1), message id m-1"
    )


def _rerun_after_prune(arrivals: set[int], archived: dict[str, int]) -> list[str]:
    """Two effects of KEY, a prune between them; the archive's rows as given."""
    seen = _completed_once(runs=[(10.0, 10.4, 1), (30.0, 30.4, 2)])
    seen.effects[KEY] = [(10.5, 10.0), (30.5, 30.0)]
    seen.effect_arrivals[KEY] = arrivals
    seen.archive = {KEY: Counter(archived)}
    sent = _accepted()
    sent.answers["evt_1"] = {"200 accepted": sum(archived.values())}
    return _kinds([PlannedEvent("evt_1", "", "plain")], sent, seen, prunes=[(20.0, 21.0)])


def test_an_arrival_run_again_after_a_prune_is_one_processed_row_for_two_effects():
    assert _rerun_after_prune({1000}, {"processed": 1}) == []
    assert _rerun_after_prune({1000, 2000}, {"processed": 2}) == []


def test_a_run_archived_a_duplicate_of_the_next_one_is_still_wrong():
    """make chaos SEED=7's `2 effects, archived 1 duplicate, 1 processed`: two arrivals ran."""
    assert _rerun_after_prune({1000, 2000}, {"duplicate": 1, "processed": 1}) == ["archive status wrong"]
    assert _rerun_after_prune({1000}, {"queued": 1}) == ["archive not settled", "archive status wrong"]


def _replayed(effects, dead_at=(), fail="", prunes=()) -> list[str]:
    """Replay 3's item KEY (tests/chaos/replays.py): its run's effects and open dead letters as given."""
    replayed = f"replay-3/{KEY}"
    seen = Observed()
    seen.effects[replayed] = list(effects)
    seen.open_dead_letters[replayed] = ["PermanentError" for _ in dead_at]
    seen.open_dead_at[replayed] = list(dead_at)
    replays = ReplaysSeen(states={3: ("done", 1, 1, 0)}, window_keys={3: {KEY}}, window_conflicts={3: set()})
    replays.items[3] = [KEY]
    if fail == "until_replayed":
        replays.replayed_keys = {replayed}  # its replay's run died, and `dlq replay --all` put it back
    issued = [IssuedReplay("events", 1.0, 2.0, 0, "", replay_id=3)]
    events, verdict = [PlannedEvent("evt_1", fail, "plain")], judge([], Sent(), Observed(), [], {})
    judge_event_replays(events, _accepted(), seen, replays, issued, (), verdict, lambda key: None, list(prunes))
    return [kind for kind, _ in verdict.violations]


def test_a_replay_key_completed_twice_is_a_violation_unless_a_prune_could_have_forgotten_the_first():
    """make chaos SEED=7's `replay ran twice`: completions 14 s apart, a prune begun 3 s before the first."""
    twice = [(34.69, 34.2), (48.70, 48.3)]
    assert _replayed(twice) == ["replay ran twice"]
    assert _replayed(twice, prunes=[(31.7, 36.0)]) == []  # its cutoff (now() - 1s) may have been read at 35.2+
    assert _replayed(twice, prunes=[(31.7, 35.0)]) == ["replay ran twice"]  # over before the first was 1 s old
    assert _replayed(twice, prunes=[(49.0, 50.0)]) == ["replay ran twice"]  # begun after the second


def test_completed_then_a_copy_dead_lettered_is_allowed_only_across_a_prune():
    """make chaos SEED=11's `completed and dead-lettered`: the dead-letter replay completed the key,
    a prune forgot that, a later copy ran as a plain run and failed for good, as its payload says."""
    event, sent = PlannedEvent("evt_1", "until_replayed", "plain"), _accepted()
    seen = _completed_once(runs=[(10.0, 10.4, 1), (30.0, 30.4, 2)])
    seen.replayed = {KEY}
    seen.open_dead_letters[KEY] = ["PermanentError"]
    seen.open_dead_at[KEY] = [30.5]
    assert _kinds([event], sent, seen) == ["completed and dead-lettered", "ran after completion"]
    assert _kinds([event], sent, seen, prunes=[(20.0, 21.0)]) == []
    assert _kinds([event], sent, seen, prunes=[(31.0, 32.0)]) != []  # begun after the dead letter
    seen.open_dead_at[KEY] = [9.0]  # dead-lettered before the effect: its replay would have marked it
    assert _kinds([event], sent, seen, prunes=[(20.0, 21.0)]) == ["completed and dead-lettered"]
    plain = PlannedEvent("evt_1", "permanent", "plain")  # never completes, prune or not
    seen.open_dead_at[KEY] = [30.5]
    assert "completed and dead-lettered" in _kinds([plain], sent, seen, prunes=[(20.0, 21.0)])
    assert _replayed([(10.5, 10.0)], [30.5], "until_replayed") == ["completed and dead-lettered"]
    assert _replayed([(10.5, 10.0)], [30.5], "until_replayed", prunes=[(20.0, 21.0)]) == []
