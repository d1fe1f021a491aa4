"""webhook_ingest.ingress.admin: what each of its modules holds.

- api            The admin HTTP API on the ingress (docs/reference.md §8): dead letters for on-call.
- events         The admin API's event archive (docs/reference.md §8): search it, read an event.
- event_replays  The admin API's replays of archived events (docs/reference.md §8, "Replaying archived events"):
- incidents      The admin API's incidents (docs/reference.md §8): the CLI's documents over HTTP.
- sources        The admin API's paused sources (docs/reference.md §8.3).
- workers        The workers as the ingress sees them (docs/design.md, "Workers report themselves")
"""

from .api import setup_admin
from .common import dead_letters_key
from .event_replays import parse_rate, start
from .sources import source_states
from .workers import workers_watch_ctx

__all__ = ["dead_letters_key", "parse_rate", "setup_admin", "source_states", "start", "workers_watch_ctx"]
