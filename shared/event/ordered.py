"""Where an event stands in its ordering key's lane (docs/design.md,
"Ordering keys"): what the worker holding the lane knows of
the row it runs. Set on the `EventMessage` the runner builds from an
`ordered_events` row, never on the wire: a wake-up carries only the lane.

- `lane`: `SOURCE[#ROUTE]:VALUE`, the row's lane.
- `seq`: its place in the lane (dense, in commit order).
- `token`: the holder's fencing token on the lane: the completion advances
  the lane only while it is still the lane's.
- `by`: the row's `ordering.by` value; None: none, or unreadable.
- `stale`: completed without its handler (`ordering.stale = "skip"` and
  `by` below the lane's last processed).
"""

from dataclasses import dataclass
from decimal import Decimal


@dataclass(frozen=True)
class OrderedStep:
    lane: str
    seq: int
    token: int
    by: Decimal | None
    stale: bool = False
