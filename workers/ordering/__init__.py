"""webhook_ingest.workers.ordering: a worker's part of ordering keys
(docs/design.md, "Ordering keys"): it holds lanes and runs their rows in order.

- runner    Offers (wake-ups, the watchdog's timers), takes, drains and lets go of lanes.
- failures  A failed ordered row: a retry in its place, or a dead letter that blocks (or skips).
- renewals  The lanes' lease renewals, many in one statement.
- coalesced Takes, pages and lets-go of many lanes in one statement; due heads in one transaction.
- store     The holder's statements (queries.sql): take, extend, page, finish, retry, dead, release, runnable.

Code outside this package imports these names from the package itself.
"""

from .coalesced import LaneHeads
from .failures import OrderedFailurePolicy
from .runner import PAGE_ROWS, LaneRunner, source_and_route
from .store import LaneStore

__all__ = ["PAGE_ROWS", "LaneHeads", "LaneRunner", "LaneStore", "OrderedFailurePolicy", "source_and_route"]
