"""The processor's state machine against in-memory stores (tests/support/in_memory.py):
every claim state and what each pass that does not complete becomes. The same
paths against the real Postgres and Redis: tests/integration/workers/claim/test_processor.py;
with real worker processes: tests/acceptance/."""

import asyncio
import dataclasses
import functools
from datetime import timedelta

import pytest

from tests.support.events import make_event
from tests.support.in_memory import InMemoryClaims, InMemoryCompletions, RecordingFailures, Session
from tests.support.logs import captured_logs
from webhook_ingest.shared.sources.model import parse_source
from webhook_ingest.workers.claim.batch import BatchProcessor
from webhook_ingest.workers.claim.processor import DEFER_SECONDS, Processor
from webhook_ingest.workers.claim.states import Outcome
from webhook_ingest.workers.handlers import PermanentError

RUNS: list[str] = []
CANCELLED: list[str] = []


async def succeed(event, ctx):
    RUNS.append(event.key)


async def fail(event, ctx):
    RUNS.append(event.key)
    raise RuntimeError("receiver answered 500")


async def refuse(event, ctx):
    RUNS.append(event.key)
    raise PermanentError("not for us")


async def hang(event, ctx):
    RUNS.append(event.key)
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        CANCELLED.append(event.key)
        raise


RUNNING: set[str] = set()
PEAK: list[int] = [0]


async def slow(event, ctx):
    """A handler that waits on the network and never touches ctx.db."""
    RUNS.append(event.key)
    RUNNING.add(event.key)
    PEAK[0] = max(PEAK[0], len(RUNNING))
    await asyncio.sleep(0.1)
    RUNNING.discard(event.key)


async def slow_db(event, ctx):
    """A handler that writes through ctx.db, then waits on the network."""
    RUNS.append(event.key)
    await ctx.db.execute("INSERT INTO effects ...")
    await asyncio.sleep(0.2)


async def swallow_db_errors(event, ctx):
    RUNS.append(event.key)
    try:
        await ctx.db.execute("INSERT INTO effects ...")
    except Exception:  # noqa: BLE001 - a careless handler
        pass


async def lose_the_fence(event, ctx):
    """Another run took the key's lease after ours ran out: our token is stale."""
    RUNS.append(event.key)
    STORE.hold_lease(event.key)


BATCH_CALLS: list[list[str]] = []


async def in_batches(event, ctx):
    RUNS.append(event.key)


async def in_batches_many(events, ctx):
    """in_batches' batch form (`handle.batch`)."""
    BATCH_CALLS.append([event.key for event in events])
    RUNS.extend(event.key for event in events)


in_batches.batchable = True  # type: ignore[attr-defined]
in_batches.batch = in_batches_many  # type: ignore[attr-defined]


async def fail_in_batches(event, ctx):
    RUNS.append(event.key)


async def fail_in_batches_many(events, ctx):
    """A batch form that fails where the handler alone does not."""
    BATCH_CALLS.append([event.key for event in events])
    raise RuntimeError("the batch form failed")


fail_in_batches.batchable = True  # type: ignore[attr-defined]
fail_in_batches.batch = fail_in_batches_many  # type: ignore[attr-defined]


async def wrong_arity(event):  # type: ignore[no-untyped-def]  # forgot ctx: calling it raises at once
    RUNS.append(event.key)


async def batch_of_wrong_arity(event, ctx):
    RUNS.append(event.key)


async def batch_of_wrong_arity_many(events):
    """A batch form that forgot ctx: calling it raises before it returns a coroutine."""
    BATCH_CALLS.append([event.key for event in events])


batch_of_wrong_arity.batchable = True  # type: ignore[attr-defined]
batch_of_wrong_arity.batch = batch_of_wrong_arity_many  # type: ignore[attr-defined]

AUDITED: list[str] = []


@functools.wraps(in_batches)  # copies in_batches' __dict__: batchable, and its batch form
async def audited(event, ctx):
    """A user's decorator around a handler with a batch form: one more effect an event."""
    AUDITED.append(event.key)
    await in_batches(event, ctx)


SEEN_HEADERS: list[dict] = []


async def keep_headers(event, ctx):
    SEEN_HEADERS.append(dict(event.headers))


async def strip_headers_then_fail(events, ctx):
    """A batch form that strips a header it has used, then fails on a later event."""
    for event in events:
        event.headers.pop("content-type", None)
    raise RuntimeError("the batch form failed after stripping headers")


keep_headers.batchable = True  # type: ignore[attr-defined]
keep_headers.batch = strip_headers_then_fail  # type: ignore[attr-defined]


HANDLERS = (
    "succeed",
    "fail",
    "refuse",
    "hang",
    "slow",
    "slow_db",
    "swallow_db_errors",
    "lose_the_fence",
    "in_batches",
    "fail_in_batches",
    "wrong_arity",
    "batch_of_wrong_arity",
    "audited",
    "keep_headers",
)
SOURCES = {
    name: parse_source(
        name, {"scheme": "hmac-sha256", "secrets": ["s"], "handler": f"tests.unit.workers.claim.test_processor:{name}"}
    )
    for name in HANDLERS
}
STORE = InMemoryCompletions()


@dataclasses.dataclass
class Pipeline:
    processor: Processor
    completions: InMemoryCompletions
    claims: InMemoryClaims
    failures: RecordingFailures


@pytest.fixture
def pipeline() -> Pipeline:
    global STORE
    RUNS.clear()
    BATCH_CALLS.clear()
    AUDITED.clear()
    SEEN_HEADERS.clear()
    CANCELLED.clear()
    RUNNING.clear()
    PEAK[0] = 0
    STORE = completions = InMemoryCompletions()
    claims, failures = InMemoryClaims(), RecordingFailures()
    return Pipeline(Processor(SOURCES, claims, completions, failures), completions, claims, failures)


def event(source: str = "succeed", event_id: str = "evt_1", **fields):
    return dataclasses.replace(make_event(source, event_id), **fields)


# -- claim states ------------------------------------------------------------------


async def test_a_fresh_key_runs_once_and_completes(pipeline):
    message = event(message_id="m1")
    assert await pipeline.processor.process(message) is Outcome.PROCESSED
    assert RUNS == [message.key]
    completion = pipeline.completions.completions[message.key]
    assert completion.payload_sha256 == message.payload_sha256 and completion.message_id == "m1"
    assert pipeline.completions.fences[message.key].lease_until is None  # the completion ended the lease
    assert pipeline.completions.turns == {}  # the turn ended with the transaction
    assert pipeline.claims.done == {message.key: message.payload_sha256} and pipeline.claims.locks == {}


async def test_a_key_redis_knows_completed_is_a_duplicate_without_postgres(pipeline):
    message = event()
    pipeline.claims.done[message.key] = message.payload_sha256
    assert await pipeline.processor.process(message) is Outcome.DUPLICATE
    assert RUNS == [] and pipeline.completions.fences == {}


async def test_a_key_postgres_knows_completed_is_a_duplicate_and_redis_learns_it(pipeline):
    message = event()
    assert await pipeline.processor.process(message) is Outcome.PROCESSED
    pipeline.claims.done.clear()  # Redis flushed
    assert await pipeline.processor.process(message) is Outcome.DUPLICATE
    assert RUNS == [message.key]
    assert pipeline.claims.done == {message.key: message.payload_sha256} and pipeline.claims.locks == {}


@pytest.mark.parametrize("redis_knows", [True, False])
async def test_another_payload_for_a_completed_key_is_a_conflict_and_the_first_stays(pipeline, redis_knows):
    first = make_event("succeed", "evt_1", {"amount": 1})
    other = make_event("succeed", "evt_1", {"amount": 2})
    assert await pipeline.processor.process(first) is Outcome.PROCESSED
    if not redis_knows:
        pipeline.claims.done.clear()
    assert await pipeline.processor.process(other) is Outcome.CONFLICT
    assert pipeline.completions.conflicts == [(first.key, first.payload_sha256, other.payload_sha256)]
    assert pipeline.completions.completions[first.key].payload_sha256 == first.payload_sha256
    assert pipeline.claims.done == {first.key: first.payload_sha256}  # a done marker, not a lock left held
    assert RUNS == [first.key]


async def test_without_a_redis_quorum_postgres_alone_decides(pipeline):
    message = event()
    pipeline.claims.unavailable = True
    assert await pipeline.processor.process(message) is Outcome.PROCESSED
    assert await pipeline.processor.process(message) is Outcome.DUPLICATE
    assert RUNS == [message.key] and pipeline.claims.done == {}


async def test_a_redis_lock_held_elsewhere_for_long_goes_on_to_postgres(pipeline):
    message = event()
    await pipeline.claims.claim(message.key)  # a holder that may be dead
    assert await pipeline.processor.process(message) is Outcome.PROCESSED
    assert RUNS == [message.key]


# -- what a pass that does not complete becomes -------------------------------------


async def test_a_key_leased_elsewhere_is_deferred_without_running(pipeline):
    message = event()
    pipeline.completions.hold_lease(message.key)
    assert await pipeline.processor.process(message) is Outcome.DEFERRED
    assert RUNS == [] and pipeline.failures.delayed == [(message.key, DEFER_SECONDS)]
    assert pipeline.claims.locks == {} and pipeline.claims.done == {}  # the Redis lock was given back


async def test_a_turn_held_in_postgres_stops_a_handler_at_its_first_query_and_defers(pipeline):
    message = event("slow_db")
    paused_holder = pipeline.completions.turns[message.key] = Session()  # its lease ran out, its session lives
    assert await pipeline.processor.process(message) is Outcome.DEFERRED
    assert RUNS == [message.key]  # started: ctx.db takes the turn at the handler's first query
    assert pipeline.failures.delayed == [(message.key, DEFER_SECONDS)]
    assert pipeline.completions.fences[message.key].lease_until is None  # released, not left to run out
    assert pipeline.completions.completions == {} and pipeline.completions.turns == {message.key: paused_holder}


async def test_a_handler_that_swallows_a_refused_turn_still_does_not_complete(pipeline):
    message = event("swallow_db_errors")
    pipeline.completions.turns[message.key] = Session()
    assert await pipeline.processor.process(message) is Outcome.DEFERRED
    assert RUNS == [message.key] and pipeline.completions.completions == {}


async def test_a_handler_that_never_queries_needs_no_turn(pipeline):
    message = event("slow")
    pipeline.completions.turns[message.key] = Session()  # only ctx.db's transactions take turns
    assert await pipeline.processor.process(message) is Outcome.PROCESSED
    assert RUNS == [message.key]


async def test_a_stale_fencing_token_refuses_the_completion_and_defers(pipeline):
    message = event("lose_the_fence")
    assert await pipeline.processor.process(message) is Outcome.DEFERRED
    assert RUNS == [message.key] and pipeline.completions.completions == {}  # rolled back, runs again later
    assert pipeline.failures.delayed == [(message.key, DEFER_SECONDS)]


async def test_a_lease_that_cannot_be_renewed_cancels_the_handler_and_defers(pipeline):
    pipeline.claims.redlock.ttl_ms = 300  # lost after two thirds of it: a fast test
    pipeline.completions.renewals_answer = False
    message = event("hang")
    assert await asyncio.wait_for(pipeline.processor.process(message), 5) is Outcome.DEFERRED
    assert CANCELLED == [message.key] and pipeline.completions.completions == {}
    assert pipeline.failures.delayed == [(message.key, DEFER_SECONDS)]
    assert pipeline.completions.turns == {}


@pytest.mark.parametrize(
    "source, attempt, outcome",
    [
        ("fail", 1, Outcome.RETRIED),
        ("fail", 5, Outcome.DEAD),  # the source's max_attempts
        ("refuse", 1, Outcome.DEAD),  # PermanentError: no retry
    ],
)
async def test_a_failed_handler_is_a_retry_decision_and_its_attempt_is_recorded(pipeline, source, attempt, outcome):
    message = event(source, attempt=attempt)
    assert await pipeline.processor.process(message) is outcome
    assert [type(exc).__name__ for exc in pipeline.failures.failed] == [
        "PermanentError" if source == "refuse" else "RuntimeError"
    ]
    fence = pipeline.completions.fences[message.key]
    assert (fence.handed_on.replay_of, fence.handed_on.attempt) == (0, attempt)  # handed on: a copy will not run
    assert fence.lease_until is None and pipeline.completions.completions == {}
    assert pipeline.claims.locks == {}


async def test_a_copy_of_an_attempt_already_handed_on_is_a_duplicate(pipeline):
    failed = event("fail")
    assert await pipeline.processor.process(failed) is Outcome.RETRIED
    assert await pipeline.processor.process(failed) is Outcome.DUPLICATE  # the same attempt again
    assert RUNS == [failed.key] and len(pipeline.failures.failed) == 1
    assert await pipeline.processor.process(event("fail", attempt=2)) is Outcome.RETRIED  # the next one runs
    assert await pipeline.processor.process(event("fail", replay_of=7)) is Outcome.RETRIED  # a replay's chain runs
    assert await pipeline.processor.process(event("fail", attempt=3)) is Outcome.DUPLICATE  # an older chain's
    assert len(RUNS) == 3


async def test_a_copy_of_an_attempt_handed_on_gives_its_redis_lock_back(pipeline):
    failed = event("fail")
    assert await pipeline.processor.process(failed) is Outcome.RETRIED
    assert await pipeline.processor.process(failed) is Outcome.DUPLICATE
    assert pipeline.claims.locks == {}  # "replaced by a done marker or released, whatever the outcome"


async def test_a_dead_letter_found_completed_meanwhile_gives_its_redis_lock_back(pipeline, monkeypatch):
    async def completed_meanwhile(event, source, exc):  # record_dead_letter's NOT EXISTS processed_events: None
        return Outcome.DUPLICATE

    monkeypatch.setattr(pipeline.failures, "fail", completed_meanwhile)
    assert await pipeline.processor.process(event("refuse")) is Outcome.DUPLICATE
    assert pipeline.claims.locks == {}


async def test_a_redelivery_whose_own_delivery_completed_is_settled_before(pipeline):
    message = event(message_id="m1")
    assert await pipeline.processor.process(message) is Outcome.PROCESSED
    assert await pipeline.completions.settled_before(message) == (True, False)
    assert await pipeline.completions.settled_before(dataclasses.replace(message, message_id="m2")) == (False, False)


async def test_prune_forgets_completions_past_the_window_with_their_attempt_records(pipeline):
    retried, done = event("fail"), event()
    assert await pipeline.processor.process(retried) is Outcome.RETRIED
    assert await pipeline.processor.process(done) is Outcome.PROCESSED
    pipeline.completions.completions[retried.key] = dataclasses.replace(  # a later attempt completed it, long ago
        pipeline.completions.completions[done.key], completed_at=0.0
    )
    assert await pipeline.completions.prune(timedelta(days=30)) == 1
    assert set(pipeline.completions.completions) == {done.key}
    pipeline.claims.done.clear()
    assert await pipeline.processor.process(retried) is Outcome.RETRIED  # a resend runs again, not a copy


# -- waits for a pooled connection (issue 20) ------------------------------------------


def bounded(pipeline: Pipeline, pool_size: int, ttl_ms: int = 300) -> Pipeline:
    """The same pipeline with `pool_size` handler-transaction sessions and a short lock TTL (a fast test)."""
    completions, claims = InMemoryCompletions(pool_size), InMemoryClaims(ttl_ms)
    global STORE
    STORE = completions
    return Pipeline(Processor(SOURCES, claims, completions, pipeline.failures), completions, claims, pipeline.failures)


async def test_a_wait_for_a_pooled_connection_does_not_eat_the_lock(pipeline):
    pipeline = bounded(pipeline, pool_size=1)
    messages = [event("slow_db", event_id=f"evt_{n}") for n in range(4)]  # 0.2 s each on the one connection
    outcomes = await asyncio.wait_for(asyncio.gather(*map(pipeline.processor.process, messages)), 10)
    assert outcomes == [Outcome.PROCESSED] * 4
    assert sorted(RUNS) == sorted(m.key for m in messages)  # each ran once
    assert pipeline.failures.delayed == []


async def test_handlers_that_do_not_use_ctx_db_run_all_at_once_on_a_small_pool(pipeline):
    pipeline = bounded(pipeline, pool_size=1)
    messages = [event("slow", event_id=f"evt_{n}") for n in range(20)]
    outcomes = await asyncio.wait_for(asyncio.gather(*map(pipeline.processor.process, messages)), 10)
    assert outcomes == [Outcome.PROCESSED] * 20 and len(RUNS) == 20
    assert PEAK[0] == 20  # no handler waited for a connection it does not use
    assert set(pipeline.completions.completions) == {m.key for m in messages}


async def test_a_batch_that_waits_for_a_pooled_connection_keeps_its_locks(pipeline):
    pipeline = bounded(pipeline, pool_size=1)
    batch = BatchProcessor(pipeline.processor, pipeline.claims, pipeline.completions)
    holders = [event("slow_db", event_id=f"evt_h{n}") for n in range(3)]
    batched = [event(event_id=f"evt_{n}") for n in range(3)]

    async def batch_after_the_holder_has_the_connection():
        await asyncio.sleep(0.05)
        return await batch.process(batched)

    holding = [pipeline.processor.process(message) for message in holders]
    *held, outcomes = await asyncio.wait_for(asyncio.gather(*holding, batch_after_the_holder_has_the_connection()), 10)
    assert held == [Outcome.PROCESSED] * 3 and outcomes == [Outcome.PROCESSED] * 3
    assert sorted(RUNS) == sorted(m.key for m in holders + batched)  # each ran once
    assert pipeline.failures.delayed == []


# -- the batch ------------------------------------------------------------------------


async def test_a_batch_completes_its_fresh_keys_in_one_transaction_and_settles_the_others(pipeline):
    batch = BatchProcessor(pipeline.processor, pipeline.claims, pipeline.completions)
    fresh, completed, copy = event(event_id="evt_1"), event(event_id="evt_2"), event(event_id="evt_1")
    pipeline.claims.done[completed.key] = completed.payload_sha256
    assert await batch.process([fresh, completed, copy]) == [Outcome.PROCESSED, Outcome.DUPLICATE, Outcome.DUPLICATE]
    assert RUNS == [fresh.key] and set(pipeline.completions.completions) == {fresh.key}


async def test_a_batch_whose_completion_is_refused_rolls_back_and_runs_each_alone(pipeline):
    batch = BatchProcessor(pipeline.processor, pipeline.claims, pipeline.completions)
    fine, stale = event(event_id="evt_1"), event("lose_the_fence", event_id="evt_2")
    assert await batch.process([fine, stale]) == [Outcome.PROCESSED, Outcome.DEFERRED]
    # both in the rolled-back transaction; then alone: the fine one again, the stale
    # one not (the run that took its lease holds it)
    assert sorted(RUNS) == sorted([stale.key, fine.key, fine.key])
    assert set(pipeline.completions.completions) == {fine.key}  # once: the batch's row was rolled back
    assert pipeline.failures.delayed == [(stale.key, DEFER_SECONDS)]


async def test_a_batch_runs_a_handlers_batch_form_once_for_its_fresh_events_in_key_order(pipeline):
    batch = BatchProcessor(pipeline.processor, pipeline.claims, pipeline.completions)
    messages = [event("in_batches", event_id=f"evt_{n}") for n in (3, 1, 2)]
    done = event("in_batches", event_id="evt_0")
    pipeline.claims.done[done.key] = done.payload_sha256
    outcomes = await batch.process([*messages, done])
    assert outcomes == [Outcome.PROCESSED] * 3 + [Outcome.DUPLICATE]
    assert BATCH_CALLS == [sorted(m.key for m in messages)]  # one call, the completed key not in it
    assert sorted(RUNS) == sorted(m.key for m in messages)
    assert set(pipeline.completions.completions) == {m.key for m in messages}


async def test_a_batch_whose_batch_form_fails_rolls_back_and_runs_each_alone_with_its_handler(pipeline):
    batch = BatchProcessor(pipeline.processor, pipeline.claims, pipeline.completions)
    messages = [event("fail_in_batches", event_id=f"evt_{n}") for n in range(3)]
    assert await batch.process(messages) == [Outcome.PROCESSED] * 3
    assert BATCH_CALLS == [[m.key for m in messages]]
    assert sorted(RUNS) == sorted(m.key for m in messages)  # each once, alone, by the handler itself
    assert set(pipeline.completions.completions) == {m.key for m in messages}
    assert pipeline.failures.delayed == [] and pipeline.failures.failed == []  # no attempt spent


async def test_a_handler_whose_call_raises_at_once_is_a_failed_handler(pipeline):
    message = event("wrong_arity")
    assert await pipeline.processor.process(message) is Outcome.RETRIED
    assert [type(exc).__name__ for exc in pipeline.failures.failed] == ["TypeError"]
    assert RUNS == [] and pipeline.completions.completions == {}


async def test_a_batch_form_whose_call_raises_at_once_runs_each_event_alone(pipeline):
    batch = BatchProcessor(pipeline.processor, pipeline.claims, pipeline.completions)
    messages = [event("batch_of_wrong_arity", event_id=f"evt_{n}") for n in range(3)]
    assert await batch.process(messages) == [Outcome.PROCESSED] * 3
    assert sorted(RUNS) == sorted(m.key for m in messages)  # each once, alone, by the handler itself
    assert set(pipeline.completions.completions) == {m.key for m in messages}
    assert pipeline.failures.delayed == [] and pipeline.failures.failed == []  # no attempt spent


async def test_a_wrapper_of_a_handler_with_a_batch_form_runs_for_every_event_of_a_batch(pipeline):
    batch = BatchProcessor(pipeline.processor, pipeline.claims, pipeline.completions)
    messages = [event("audited", event_id=f"evt_{n}") for n in range(3)]
    assert await batch.process(messages) == [Outcome.PROCESSED] * 3
    assert set(pipeline.completions.completions) == {m.key for m in messages}
    assert sorted(AUDITED) == sorted(m.key for m in messages)  # the wrapper's effect, once an event
    assert sorted(RUNS) == sorted(m.key for m in messages)


async def test_a_batch_forms_failure_is_logged_with_its_error(pipeline):
    batch = BatchProcessor(pipeline.processor, pipeline.claims, pipeline.completions)
    messages = [event("fail_in_batches", event_id=f"evt_{n}") for n in range(3)]
    with captured_logs() as logs:
        assert await batch.process(messages) == [Outcome.PROCESSED] * 3
    failed = [line for line in logs if line["event"] == "batch_form_failed"]
    assert len(failed) == 1 and "the batch form failed" in failed[0]["error"]
    assert failed[0]["handler"] == "fail_in_batches" and failed[0]["events"] == 3


async def test_a_failed_batch_forms_changes_to_headers_do_not_reach_the_runs_alone(pipeline):
    batch = BatchProcessor(pipeline.processor, pipeline.claims, pipeline.completions)
    messages = [event("keep_headers", event_id=f"evt_{n}") for n in range(2)]
    assert await batch.process(messages) == [Outcome.PROCESSED] * 2
    assert SEEN_HEADERS == [{"content-type": "application/json"}] * 2
    assert all(message.headers == {"content-type": "application/json"} for message in messages)
