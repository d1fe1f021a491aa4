"""webhook_ingest.shared.db: what each of its modules holds.

- sessions      Postgres sessions that a silent server cannot hold
- queries       Named SQL blocks loaded from a package's `queries.sql`.
- values        Values as Postgres stores them and the JSON documents show them: jsonb, UTC instants, JSON.
- schema        The schema this release needs: every migration it ships (`shared/migrations/`) applied.
- group_commit  Many callers, one write per batch
- pooler        A pooler in transaction mode in front of Postgres is refused at start (docs/operations.md …
"""
