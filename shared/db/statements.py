"""The named statements of `shared/queries.sql`, loaded once: `SQL[name]`.

Every store of `shared/` (dead letters, the audit log, pauses, incidents,
replays, heartbeats) and the workers' notifications read their statements
from this one dictionary (`shared/db/queries.py` parses the file).
"""

from webhook_ingest.shared.db.queries import load_queries

SQL = load_queries("webhook_ingest.shared")
