"""webhook_ingest.shared.runs: what each of its modules holds.

- paced  Acting on a frozen set one item at a time
- locks  A paced run's locks: what orders a Cancel against the item in flight, and what lets a Cancel …
"""

from .locks import BULK_ACTIONS, EVENT_REPLAYS, Hold, RunBusy, holding, run_lock, waiting_for_run
from .paced import DEFAULT_RATE, MAX_RATE, MIN_RATE, TAKEN_OVER, PacedRunner, run

__all__ = [
    "BULK_ACTIONS",
    "DEFAULT_RATE",
    "EVENT_REPLAYS",
    "MAX_RATE",
    "MIN_RATE",
    "TAKEN_OVER",
    "Hold",
    "PacedRunner",
    "RunBusy",
    "holding",
    "run",
    "run_lock",
    "waiting_for_run",
]
