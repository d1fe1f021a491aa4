"""A replay by selection's keys (shared/replays/keys.py; docs/design.md, "A
replay by selection"): one per (event, replay), never an original key, split
back into one (replay, key) only; and what `event.replay` says of a run."""

from dataclasses import replace
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from tests.support.events import make_event
from webhook_ingest.shared.event import ids as event_id
from webhook_ingest.shared.event.message import from_amqp, to_amqp
from webhook_ingest.shared.replays.keys import parse, replay_key
from webhook_ingest.shared.replays.model import replayed_message
from webhook_ingest.shared.sources.model import parse_source
from webhook_ingest.shared.sources.routes import route_key
from webhook_ingest.workers.fan_out import route_messages
from webhook_ingest.workers.handlers import Replay, replay_of

SOURCES = st.text(min_size=1).filter(lambda name: ":" not in name and "/" not in name)  # what parse_source allows
IDS = st.text()
REPLAYS = st.integers(min_value=1, max_value=2**63 - 1)


@given(SOURCES, IDS, REPLAYS)
def test_a_replay_key_splits_back_into_its_replay_and_key_and_no_original_key_is_one(source, event, replay):
    key = event_id.idempotency_key(source, event)
    assert parse(key) is None
    assert parse(replay_key(key, replay)) == (replay, key)
    assert parse(route_key(replay_key(key, replay), "billing")) == (replay, route_key(key, "billing"))


@given(SOURCES, IDS, REPLAYS, SOURCES, IDS, REPLAYS)
def test_two_pairs_never_share_a_key(source_a, id_a, replay_a, source_b, id_b, replay_b):
    a, b = event_id.idempotency_key(source_a, id_a), event_id.idempotency_key(source_b, id_b)
    if (a, replay_a) != (b, replay_b):
        assert replay_key(a, replay_a) != replay_key(b, replay_b)
    assert replay_key(a, replay_a) != b


def test_event_replay_says_which_replay_a_run_is_of():
    assert replay_of("stripe:evt_1", 0) is None  # the event's own run
    assert replay_of("stripe:evt_1", 4) == Replay("stripe:evt_1", None, 4)  # a dead letter's replay
    assert replay_of("replay-7/stripe:evt_1", 0) == Replay("stripe:evt_1", 7, None)
    assert replay_of("replay-7/stripe:evt_1#billing", 9) == Replay("stripe:evt_1#billing", 7, 9)  # a route's, replayed


def test_a_replayed_message_is_the_arrival_under_the_replay_key_and_fans_out_to_every_route():
    event = make_event("acme", "evt_1", {"type": "invoice.paid"})
    arrival = {
        "source": "acme",
        "key": event.key,
        "event_id": "evt_1",
        "payload_sha256": event.payload_sha256,
        "received_at": datetime.fromtimestamp(1_700_000_000.123, UTC),
        "body": event.body,
        "headers": '{"content-type": "application/json"}',
    }
    message = from_amqp(event.body, dict(to_amqp(replayed_message(arrival, 7)).headers or {}))
    assert message == replace(
        event, key="replay-7/acme:evt_1", received_at=1_700_000_000.123, message_id=message.message_id
    )
    source = parse_source(
        "acme",
        {
            "scheme": "stripe",
            "secrets": ["s"],
            "routes": [{"name": "billing", "handler": "inbox"}, {"name": "crm", "handler": "inbox"}],
        },
    )
    assert [m.key for m in route_messages(source, message)] == [
        "replay-7/acme:evt_1#billing",
        "replay-7/acme:evt_1#crm",
    ]
