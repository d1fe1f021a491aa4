"""webhook_ingest.workers.failures: what each of its modules holds.

- outage           Outages are not failures (docs/reference.md §7): telling them apart, and waiting them out.
- incident_counts  Retries counted in their incidents behind the runs' backs.
- notifications    Notifications of incidents (docs/oncall.md, "Incidents")
"""

from .incident_counts import IncidentCounts
from .notifications import Notifier, targets_from
from .outage import BROKER_LOST, POSTGRES_LOST, OutageGate, found_in_chain, outage_kind, when_let_in

__all__ = [
    "BROKER_LOST",
    "POSTGRES_LOST",
    "IncidentCounts",
    "Notifier",
    "OutageGate",
    "found_in_chain",
    "outage_kind",
    "targets_from",
    "when_let_in",
]
