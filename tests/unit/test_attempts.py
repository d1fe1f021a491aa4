"""Which message is a copy of an attempt already handed on (workers/attempts.py)."""

from dataclasses import replace

import pytest

from tests.unit.test_message import event, over_the_wire
from webhook_ingest.shared.message import from_amqp, to_amqp
from webhook_ingest.workers.attempts import HandedOn, already_handed_on


@pytest.mark.parametrize(("replay_of", "attempt", "recorded", "copy"), [
    (0, 1, HandedOn(), False),  # nothing ran yet
    (0, 2, HandedOn(0, 1), False),  # the next attempt
    (0, 2, HandedOn(0, 2), True),  # a second retry message of one attempt
    (0, 1, HandedOn(0, 2), True),  # an older attempt of the chain
    (0, 1, HandedOn(0, 3), True),  # a copy after the chain ended in a dead letter
    (7, 1, HandedOn(0, 3), False),  # a replay: a new chain
    (7, 1, HandedOn(7, 1), True),  # the replay's own attempt, handed on
    (0, 3, HandedOn(7, 1), True),  # the chain before the replay
])
def test_a_message_is_a_copy_only_of_an_attempt_handed_on(replay_of, attempt, recorded, copy):
    message = replace(event(1.0), replay_of=replay_of, attempt=attempt)
    assert already_handed_on(message, recorded) is copy


def test_a_replay_is_known_as_one_across_the_wire():
    replayed = replace(event(1.0), attempt=3).fresh(replay_of=42)
    received = from_amqp(replayed.body, over_the_wire(to_amqp(replayed)))
    assert (received.replay_of, received.attempt) == (42, 1)
    assert from_amqp(b"{}", over_the_wire(to_amqp(event(1.0)))).replay_of == 0
