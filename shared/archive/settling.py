"""Settling the event archive from what Postgres itself recorded
(docs/design.md, "The settling sweep"): the decision, as plain code.

A worker writes what became of each arrival in batches behind its back
(workers/claim/archive_notes.py), after the commit and the ack they describe. A
worker killed while a batch waited for Postgres (cut, or slow) takes the
batch with it: the event completed or went dead, durably, and its row says
`queued` (or `retrying`) for ever. The archive's upkeep sweeps such rows
(shared/upkeep.py): a row still unsettled past a grace whose event
Postgres recorded an end of, as long ago, is brought up to that end.

What an end says of one arrival:
- an open dead letter of its payload, under its key or one of its routes'
  (`KEY#ROUTE`): `dead` (each copy of a dead event ran and died again);
- else a completion of its key or of a route's: `conflict` when the
  completed payload is another; else `processed` for the arrival the
  completion names (`processed_events.arrival`: the message that ran
  carried it) — `stale` when the completion is one (`processed_events.stale`:
  an ordered event older than its lane's last, completed unrun; an end as
  `processed` is) — and `duplicate` for the others. A completion that names
  none (written before migration 0020, by a previous release's worker, or
  of a message queued before arrivals had ids) leaves a guess: `processed`
  for the oldest arrival of the key not settled yet, when none is archived
  `processed` already, `duplicate` for the others (the count is right, one
  run, one `processed`; the attribution may not be);
- else a discarded dead letter of its payload: `discarded` for the arrival
  it was, `dead` for another;
- else nothing: the event is still on its way (a backlog, a retry's delay).
  The row is left as it is. A completion is never pruned unread: `prune`
  settles the rows of the events whose completions it deletes with this
  same decision, in its transaction (ArchiveStore.settle_pruned).

Its attempts become at least the end's, so an outcome batch that arrives
after all (a worker's batch held through a long outage) is written over
the sweep's only when it is a step on (`event_archive_step`): one run is
never archived `processed` twice. A copy settled `dead` by another
arrival's dead letter keeps its own attempts: still in the queue, it may
yet run, and its outcome then steps over the sweep's.
"""

from collections.abc import Iterable, Mapping
from datetime import datetime

from .model import CONFLICT, DEAD, DISCARDED, DUPLICATE, ENDS_RUN, PROCESSED, STALE

End = tuple[str, int, datetime | None]  # status, attempts, completed_at
# An end this recent may still have its outcome batch on its way: the sweep
# leaves it. Within it a live `processed` also steps over a twin message's
# `duplicate` of its arrival (`archive_outcomes`): no sweep, this release's
# or the previous one's (60 s too), can have written that `duplicate` yet.
GRACE_SECONDS = 60.0


def settled(rows: Iterable[Mapping]) -> list[tuple]:
    """What the sweep writes for `rows` (`archive_unsettled`'s, oldest
    first), in the columns of `archive_settle`: each row whose event's end
    Postgres recorded, with the status, attempts and chain it was read with
    (a row changed since is left to the next round)."""
    processed: set[tuple[str, str]] = set()
    writes = []
    for row in rows:
        named = (row["source"], row["key"])
        end = end_of(row, already_processed=row["processed_already"] or named in processed)
        if end is None:
            continue
        status, attempts, completed_at = end
        if status in ENDS_RUN:
            processed.add(named)
        writes.append(
            (
                row["source"],
                row["key"],
                row["received_at"],
                row["arrival"],
                row["status"],
                row["attempts"],
                status,
                attempts,
                completed_at,
                row["replay_of"],
            )
        )
    return writes


def end_of(row: Mapping, already_processed: bool) -> End | None:
    """The end Postgres recorded of one arrival's event, or None."""
    attempts = row["attempts"]
    if row["dead_letter"] == "dead":  # another arrival's: this copy may yet run (its own outcome then steps on)
        return DEAD, max(attempts, row["dead_attempts"]) if row["own_dead_letter"] else attempts, None
    if row["completed_sha256"] is not None:
        attempts = max(attempts, row["completed_attempts"])
        if row["completed_sha256"] != row["payload_sha256"]:
            return CONFLICT, attempts, None
        if ran(row, already_processed):
            return STALE if row.get("completed_stale") else PROCESSED, attempts, row["completed_at"]
        return DUPLICATE, attempts, None
    if row["dead_letter"] == "discarded":
        return DISCARDED if row["own_dead_letter"] else DEAD, max(attempts, row["dead_attempts"]), None
    return None


def ran(row: Mapping, already_processed: bool) -> bool:
    """Whether this arrival is the one its event's completion ran: the one it
    names, else (it names none) the oldest not settled, unless one is
    archived `processed` already."""
    if row["completed_arrival"] is None:
        return not already_processed
    return bool(row["completed_arrival"] == row["arrival"])
