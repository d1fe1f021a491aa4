"""webhook_ingest.shared.ordering: ordering keys' rows in Postgres (docs/design.md,
"Ordering keys"), the statements several sides run.

- model  What the rows are to Python: OrderedRow in, Accepted out, the reads' shapes.
- documents  The JSON documents of a blocked lane and of one lane (CLI, admin API).
- store  The insert (ingress, replays by selection), a dead letter's replay in place and discard, the reads.

Code outside this package imports these names from the package itself.
"""

from .documents import blocked_document, lane_document
from .model import (
    Accepted,
    BlockedLane,
    LaneRow,
    LaneState,
    OrderedRow,
    Waiting,
    event_of,
    lane_value,
    ordered_row,
)
from .store import (
    LANE_ROWS,
    blocked_lanes,
    discard_ordered,
    insert_ordered,
    lane_state,
    replay_in_place,
    waiting_by_source,
    waiting_lanes,
)

__all__ = [
    "LANE_ROWS",
    "Accepted",
    "BlockedLane",
    "LaneRow",
    "LaneState",
    "OrderedRow",
    "Waiting",
    "blocked_document",
    "blocked_lanes",
    "discard_ordered",
    "event_of",
    "insert_ordered",
    "lane_document",
    "lane_state",
    "lane_value",
    "ordered_row",
    "replay_in_place",
    "waiting_by_source",
    "waiting_lanes",
]
