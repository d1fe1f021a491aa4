"""The idempotency keys of a replay by selection (docs/design.md, "A replay
by selection"): replay R of the event keyed K runs under `replay-R/K`.

A new key per (event, replay) is what makes a replay run once — its
copies, its redeliveries after a SIGKILL, a replay message published twice
by a runner that died between its publish and its progress are copies of
that key, settled by every exactly-once step the workers already have (lock,
lease, turn, fence, completion, attempts handed on, dead letter) — and what
lets the next replay of the same event run it again: another R, another key.
The event's own completion is never touched.

No original key can be a replay key: an original is `SOURCE:EVENT_ID`, and a
source's name holds neither `:` nor `/` (shared/sources/model.py), so the part of
an original key before its first `:` never holds a `/`; a replay key's does
(`replay-R/SOURCE`). A replay key splits back into one (R, K) only. A
route's run of a replayed event appends its route as for any key
(`replay-R/K#ROUTE`).
"""

import re

PREFIX = "replay-"
_REPLAY = re.compile(r"replay-([1-9][0-9]*)/")


def replay_key(key: str, replay_id: int) -> str:
    """The key replay `replay_id` runs the event keyed `key` under."""
    return f"{PREFIX}{replay_id}/{key}"


def parse(key: str) -> tuple[int, str] | None:
    """(replay id, the event's own key) of a replay key; None for any other key."""
    if not key.startswith(PREFIX):
        return None
    match = _REPLAY.match(key)
    if match is None or "/" not in key.partition(":")[0]:
        return None
    return int(match.group(1)), key[match.end() :]
