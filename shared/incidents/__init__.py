"""webhook_ingest.shared.incidents: what each of its modules holds.

- model  Incidents: failures grouped by what went wrong (docs/oncall.md, "Incidents").
- store  The incident store: the workers' one write (`record_failure`), and reading incidents and acting …
"""

from .model import event_document, incident_document
from .store import STATES, Failure, IncidentNotFound, IncidentStore, record_failure

__all__ = [
    "STATES",
    "Failure",
    "IncidentNotFound",
    "IncidentStore",
    "event_document",
    "incident_document",
    "record_failure",
]
