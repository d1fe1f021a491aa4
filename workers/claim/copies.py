"""Copies of an event that reach a worker while it is still working on the
first one wait for it, instead of asking Redis again and again.

Providers send copies together (a retry racing a slow answer), and the
ingress queues them back to back, so a worker often holds several copies
of one key at once. Only the first (the leader) goes through the state
machine; the others wait for its outcome here, in memory. A copy is acked
as a duplicate at the cost of a dict lookup when the leader, with the same
payload hash, either completed the event, or settled the same attempt of
the same chain: found it completed or already handed on, or handed it on
durably itself (a retry message confirmed by the broker, a dead letter
committed). Otherwise (the leader crashed, never ran or deferred, the
payloads differ, or the copy is another attempt or replay: a retry waiting
behind a stale copy of its earlier attempt must still run) a copy goes
through the state machine itself, so nothing here can lose an event.

A deferral settles nothing: it is the same attempt again, and the message
that carries it can come back while its leader is still registered here
(it publishes the deferral, then gives back its lease and lock) — settled
as its own leader's copy, the only message carrying the event was acked
(issue 20). A copy whose leader deferred runs, and at worst defers too.
"""

import asyncio
from dataclasses import dataclass, field

from webhook_ingest.shared.event import EventMessage

from .states import Outcome

# The leader settled the event for its copies too: completed, or carried on
# by the retry message it published, or recorded as a dead letter. A copy
# run again would start a second retry chain (more attempts, sooner, than
# the source allows). STALE completed it too (unrun, ordering keys). Not
# DEFERRED: see the module's last paragraph.
_SETTLED = (Outcome.PROCESSED, Outcome.STALE, Outcome.DUPLICATE, Outcome.RETRIED, Outcome.DEAD)


@dataclass
class _Leader:
    event: EventMessage
    outcome: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class CopiesInFlight:
    def __init__(self):
        self._leaders: dict[str, _Leader] = {}

    def keys_led(self) -> int:
        """Keys this process leads: taking their lease, running, or settling (its heartbeat)."""
        return len(self._leaders)

    def leader(self, key: str) -> _Leader | None:
        return self._leaders.get(key)

    def lead(self, event: EventMessage) -> None:
        self._leaders[event.key] = _Leader(event)

    def settle(self, event: EventMessage, outcome: Outcome | None) -> None:
        """The leader's outcome (None: it ended without one, e.g. it crashed)."""
        leader = self._leaders.get(event.key)
        if leader is not None and leader.event is event:
            del self._leaders[event.key]
            leader.outcome.set_result(outcome)

    def abandon(self, events: list[EventMessage]) -> None:
        """Leaders that will not run (shutdown): their copies stop waiting."""
        for event in events:
            self.settle(event, None)

    @staticmethod
    async def completed_for(leader: _Leader, copy: EventMessage) -> bool:
        """Waits for the leader; True when the copy is settled with it (ack it as a duplicate)."""
        outcome = await asyncio.shield(leader.outcome)
        if outcome not in _SETTLED or leader.event.payload_sha256 != copy.payload_sha256:
            return False
        return outcome in (Outcome.PROCESSED, Outcome.STALE) or _same_attempt(leader.event, copy)


def _same_attempt(leader: EventMessage, copy: EventMessage) -> bool:
    # A leader's DUPLICATE may only mean "this attempt was already handed on"
    # (workers/claim/attempts.py), which says nothing about a later attempt or a replay.
    return (leader.replay_of, leader.attempt) == (copy.replay_of, copy.attempt)
