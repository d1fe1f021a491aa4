"""One failed attempt leads to at most one next attempt, whatever the broker does.

A retry message can exist twice: a publish whose confirm never came may
still have reached the broker, copies of an event on two workers each
start a chain, a lost ack brings a settled message back. So the key's fence
row remembers the last attempt handed on — its retry message confirmed by
the broker, or its dead letter committed — and a message for an attempt up
to that one is a copy: acked, not run again. The record is written while
the failed run still holds the key's lease, and only once the next attempt
is durable, so a worker that died before that (a crash mid-handler, before
the confirm) leaves its attempt to run again when its message comes back.

A replay from the dead letters starts a new chain at attempt 1: its
messages carry the replay's id (`replay_of`: dead_letter_replays.id, which
only grows, a new one for every replay, also of a dead letter replayed
before), and a chain older than the recorded one is stale as a whole.
Only a message with the recorded payload is a copy: another payload under
the key is another event, which the state machine runs or records as a
conflict. Discarding a dead letter forgets its record, so the provider
sending the event again runs it. Why, and what still
runs an attempt twice: docs/design.md, "One next attempt per failed attempt".
The record is written by `CompletionStore.record_handed_on` (`workers.claim.completions`).
"""

from dataclasses import dataclass

from webhook_ingest.shared.event import EventMessage


@dataclass(frozen=True)
class HandedOn:
    """The key's last attempt handed on, in its chain (0: the ingress's)."""

    replay_of: int = 0
    attempt: int = 0
    payload_sha256: str | None = None


def already_handed_on(message: EventMessage, handed_on: HandedOn) -> bool:
    """Whether `message` is for an attempt already run and handed on."""
    if message.payload_sha256 != handed_on.payload_sha256:
        return False
    if message.replay_of != handed_on.replay_of:
        return message.replay_of < handed_on.replay_of
    return message.attempt <= handed_on.attempt
