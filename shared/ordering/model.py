"""Ordering keys' rows as Python sees them (docs/design.md,
"Ordering keys"): what the insert takes (`OrderedRow`) and
answers (`Accepted`), and what the reads give (`BlockedLane`, `LaneState`,
`Waiting`). A lane is `SOURCE[#ROUTE]:VALUE` (shared/sources/ordering.py):
a source has no ':' or '#', a route no ':', so it splits one way.

An ordered row keeps the event as the outbox does (shared/db's
`outbox.amqp_headers`): the body as received and the AMQP header table the
message would have been published with, so the runner rebuilds the very
`EventMessage` (`event_of`) a broker delivery would have carried.
"""

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from pamqp import decode, encode

from webhook_ingest.shared.event import EventMessage, amqp_headers, from_amqp

ROUTE_SEPARATOR = "#"
VALUE_SEPARATOR = ":"


@dataclass(frozen=True)
class OrderedRow:
    """One event appended to its lane (`insert_ordered`)."""

    lane: str
    source: str
    route: str  # "": the source's own lane
    key: str  # its idempotency key: KEY, KEY#ROUTE, replay-R/KEY
    arrival: int
    by_value: Decimal | None
    body: bytes
    amqp_headers: bytes  # the header table, encoded as the outbox's
    replay_of: int = 0


@dataclass(frozen=True)
class Accepted:
    """Where a row went: its lane and seq; `woke`: the lane went idle -> busy
    with it (its first row of the batch), so it needs a wake-up."""

    lane: str
    seq: int
    woke: bool


@dataclass(frozen=True)
class BlockedLane:
    lane: str
    source: str
    route: str  # "": the source's own
    value: str
    since: datetime
    age_seconds: float
    dead_letter_id: int
    waiting: int  # rows pending behind it


@dataclass(frozen=True)
class LaneRow:
    seq: int
    key: str
    arrival: int
    by_value: Decimal | None
    accepted_at: datetime
    attempt: int
    replay_of: int
    deliveries: int
    state: str  # pending, dead
    dead_letter_id: int | None


@dataclass(frozen=True)
class LaneState:
    lane: str
    source: str
    route: str
    value: str
    next_seq: int  # seqs given
    pending: int
    token: int
    holder: str | None
    lease_until: datetime | None
    held: bool  # the lease has not ended
    ready_at: datetime | None
    last_by: Decimal | None
    blocked_by: int | None  # the dead letter it waits on
    blocked_since: datetime | None
    rows: tuple[LaneRow, ...]  # the first LANE_ROWS, in the order they run


@dataclass(frozen=True)
class Waiting:
    """One source's ordered events: rows pending and the oldest's age, lanes blocked and the oldest block's."""

    waiting: int = 0
    oldest_seconds: float = 0.0
    blocked: int = 0
    blocked_oldest_seconds: float = 0.0


def lane_value(lane: str) -> str:
    """The key's value a lane is of."""
    return lane.partition(VALUE_SEPARATOR)[2]


def ordered_row(event: EventMessage, lane: str, by_value: Decimal | None) -> OrderedRow:
    """`event` as the row of `lane` that carries it."""
    return OrderedRow(
        lane=lane,
        source=event.source,
        route=event.route,
        key=event.key,
        arrival=event.arrival,
        by_value=by_value,
        body=event.body,
        amqp_headers=encode.field_table(amqp_headers(event)),
        replay_of=event.replay_of,
    )


def event_of(body: bytes, encoded_headers: bytes) -> EventMessage:
    """The event an ordered row carries (its `ordered` step is the runner's to set)."""
    _, headers = decode.field_table(encoded_headers)
    return from_amqp(body, headers)
