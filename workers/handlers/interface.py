"""The handler API (docs/reference.md §7): what a handler is given, what it
returns, what it raises. Below the package's __init__.py (which finds a
source's handler) and the built-in handlers (forward.py, inbox.py) alike:
they import it from here, never the package that loads them."""

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

from webhook_ingest.shared.event import payloads
from webhook_ingest.shared.replays import keys as replay_keys


class PermanentError(Exception):
    """The event can never succeed: dead-letter it without retrying."""


@dataclass(frozen=True)
class Replay:
    """What `event.replay` tells a replayed run (docs/reference.md §7, Handler API)."""

    event_key: str  # the key the event's own run used (a route's run: its route key)
    events_replay: int | None = None  # the replay by selection (`events replay`: event_replays.id) this run is of
    dead_letter_replay: int | None = None  # the dead letter's replay (dead_letter_replays.id) that started its chain


def replay_of(key: str, replay_of_dead_letter: int) -> Replay | None:
    """A run's `event.replay` from its key (`replay-R/KEY`: shared/replays/keys.py)
    and its chain (`x-replay-of`); None for the event's own run."""
    parsed = replay_keys.parse(key)
    if parsed is None and not replay_of_dead_letter:
        return None
    events_replay, event_key = parsed if parsed is not None else (None, key)
    return Replay(event_key, events_replay, replay_of_dead_letter or None)


@dataclass(frozen=True)
class Event:
    source: str
    event_id: str
    key: str
    headers: dict[str, str]
    received_at: datetime
    attempt: int
    body: bytes = field(repr=False)
    route: str = ""  # the route this run is for ("" : the source's one handler); `key` is then KEY#ROUTE
    replay: Replay | None = None  # None: the event's own run; else which replay this run is of

    @cached_property
    def payload(self) -> Any:
        """The body parsed on first use: a url-encoded form as a dict (shared/event/payloads.py),
        anything else as JSON (stdlib json: exact big integers)."""
        if payloads.is_form(self.headers.get("content-type")):
            return payloads.parse_form(self.body)
        return json.loads(self.body)


@dataclass(frozen=True)
class HandlerContext:
    db: Any
    options: dict[str, Any]
    logger: Any


Handler = Callable[[Event, HandlerContext], Awaitable[dict | None]]
