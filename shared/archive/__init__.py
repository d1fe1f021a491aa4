"""webhook_ingest.shared.archive: what each of its modules holds.

- model     The event archive, as plain code (docs/design.md, "The archive")
- store     The event archive's Postgres
- writer    Rows written behind their callers' backs, in batches
- settling  Settling the event archive from what Postgres itself recorded (docs/design.md, "The settling sweep")
- search    Searching the event archive
"""
