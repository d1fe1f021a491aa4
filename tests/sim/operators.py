"""What happens beside the workers: on-call's replays and discards, `prune`,
and the poison drainer that records what the broker dead-lettered.

Each is one atomic step on the simulated server at its time, as its SQL
is one transaction: a replay marks an open dead letter replayed and
publishes the event afresh under a new replay id (`claim_for_replay`, then
the publish); a bulk replay does so for every open dead letter at once;
an event replay (a replay by selection) publishes every event accepted so
far under a new key of its own, `replay-R/KEY`, all at once; a discard marks it discarded and forgets the key's attempt
record of that payload (`forget_handed_on`); prune forgets completions,
with their attempt records, and fence rows older than its window. A key
forgotten so starts a new epoch in the ledger: a copy may run it again,
by design. The drainer (`workers/poison.py`, its decisions) records a
dead letter for a dead-lettered message unless its event completed, and
the message's attempt handed on.
"""

from datetime import timedelta

from tests.sim.broker import Envelope
from webhook_ingest.shared.broker import topology
from webhook_ingest.shared.event.message import from_amqp, to_amqp
from webhook_ingest.shared.replays import keys as replay_keys
from webhook_ingest.shared.sources import routes as route_rules
from webhook_ingest.workers.claim.attempts import HandedOn


def replay(sim) -> None:
    rows = sim.server.open_dead_letters()
    if rows:
        _replay(sim, sim.rng.choice(rows))


def bulk_replay(sim) -> None:
    """A bulk replay of every open dead letter: their events all published at once."""
    for row in sim.server.open_dead_letters():
        _replay(sim, row)


def event_replay(sim) -> None:
    """A replay by selection (shared/replays/keys.py): every event accepted so
    far, each under its own new key `replay-R/KEY`, published at once beside
    the traffic, its copies and retries."""
    replay_id = next(sim.event_replay_ids)
    events = sorted(
        {
            (key, sha)
            for key, sha in sim.ledger.accepted
            if replay_keys.parse(key) is None and route_rules.SEPARATOR not in key
        }
    )
    sim.note("operator", "event replay", None, f"replay {replay_id} of {len(events)} events")
    for key, sha in events:
        sim.publish_replay(key, sha, replay_id)


def _replay(sim, row) -> None:
    row.status = "replayed"
    sim.server.store.open_dead_letters.discard((row.event.key, row.event.payload_sha256))
    replay_of = next(sim.server.replay_ids)
    sim.note("operator", "replay", row.event.key, f"dead letter #{row.id} as replay {replay_of}")
    sim.publish(to_amqp(row.event.fresh(replay_of=replay_of)))


def discard(sim) -> None:
    rows = sim.server.open_dead_letters()
    if not rows:
        return
    row = sim.rng.choice(rows)
    key, sha = row.event.key, row.event.payload_sha256
    row.status = "discarded"
    sim.server.store.open_dead_letters.discard((key, sha))
    fence = sim.server.store.fences.get(key)
    if fence is not None and fence.handed_on.payload_sha256 == sha:
        fence.handed_on = HandedOn()
    sim.ledger.discarded.add((key, sha))
    sim.ledger.forgotten(key)
    sim.note("operator", "discard", key, f"dead letter #{row.id}")


async def prune(sim, window_seconds: float) -> None:
    store = sim.server.store
    completed = {key: completion.payload_sha256 for key, completion in store.completions.items()}
    records = {key: fence.handed_on for key, fence in store.fences.items()}
    sim.ledger.ever_completed |= set(completed.items())
    pruned = await store.prune(timedelta(seconds=window_seconds))
    forgotten = {key for key in completed if key not in store.completions}
    forgotten |= {
        key
        for key, record in records.items()
        if record != HandedOn() and (key not in store.fences or store.fences[key].handed_on != record)
    }
    for key in sorted(forgotten):
        sim.ledger.forgotten(key)
    sim.note(
        "operator", "prune", None, f"window {window_seconds}s: {pruned} completions, {len(forgotten)} keys forgotten"
    )


async def drain_dead(sim, envelope: Envelope) -> None:
    event = from_amqp(envelope.body, envelope.headers)
    completion = sim.server.store.completions.get(event.key)
    if completion is None or completion.payload_sha256 != event.payload_sha256:
        if sim.server.insert_dead_letter(event) is not None:
            await sim.server.store.record_handed_on(event)
    sim.broker.let_go(envelope, "the drainer recorded it")


def events_queue_arguments(sim) -> dict:
    return {
        "x-delivery-limit": sim.plan.config.delivery_limit,
        "x-dead-letter-routing-key": topology.dead_queue(sim.namespace),
    }
