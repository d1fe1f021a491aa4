"""Findings on record: a violation that matches one is reported with its
name and does not stop `make simulate` or fail the short run, so the
search goes on for new ones. Each has a strict xfail in
`tests/sim/test_simulator.py` that replays it; when its fix lands, that
test passes, its marker goes, and so does its entry here.

- F1: the key's attempt record (`key_fences`: chain, attempt, payload)
  holds one payload and only moves forward, so a second payload under the
  key whose attempt fails is never recorded handed on (its attempt number
  is not higher); a copy of that payload runs its attempt again, also
  while its dead letter is open (docs/design.md, "One next attempt per
  failed attempt", says such a copy is a duplicate).
"""


def rerun(store, key: str, sha: str, replay_of: int, attempt: int) -> str:
    """The finding a second run of this attempt is, or ""."""
    fence = store.fences.get(key)
    if fence is None:
        return ""
    recorded = fence.handed_on
    if recorded.payload_sha256 not in (None, sha) and (recorded.replay_of, recorded.attempt) >= (replay_of, attempt):
        return "F1"
    return ""
