"""Which message is a copy of an attempt already handed on (workers/claim/attempts.py)."""

from dataclasses import replace

import pytest

from tests.unit.shared.event.test_message import event, over_the_wire
from webhook_ingest.shared.event.message import from_amqp, to_amqp
from webhook_ingest.workers.claim.attempts import HandedOn, already_handed_on

SAME = event(1.0).payload_sha256


@pytest.mark.parametrize(
    ("replay_of", "attempt", "recorded", "copy"),
    [
        (0, 1, HandedOn(), False),  # nothing ran yet
        (0, 2, HandedOn(0, 1, SAME), False),  # the next attempt
        (0, 2, HandedOn(0, 2, SAME), True),  # a second retry message of one attempt
        (0, 1, HandedOn(0, 2, SAME), True),  # an older attempt of the chain
        (0, 1, HandedOn(0, 3, SAME), True),  # a copy after the chain ended in a dead letter
        (7, 1, HandedOn(0, 3, SAME), False),  # a replay: a new chain
        (7, 1, HandedOn(7, 1, SAME), True),  # the replay's own attempt, handed on
        (0, 3, HandedOn(7, 1, SAME), True),  # the chain before the replay
        (0, 1, HandedOn(0, 3, "another payload"), False),  # another event under the key (adversary B3)
        (0, 1, HandedOn(0, 0), False),  # a record forgotten by a discard (adversary B2)
    ],
)
def test_a_message_is_a_copy_only_of_an_attempt_handed_on(replay_of, attempt, recorded, copy):
    message = replace(event(1.0), replay_of=replay_of, attempt=attempt)
    assert already_handed_on(message, recorded) is copy


def test_a_replay_is_known_as_one_across_the_wire():
    replayed = replace(event(1.0), attempt=3).fresh(replay_of=42)
    received = from_amqp(replayed.body, over_the_wire(to_amqp(replayed)))
    assert (received.replay_of, received.attempt) == (42, 1)
    assert from_amqp(b"{}", over_the_wire(to_amqp(event(1.0)))).replay_of == 0
