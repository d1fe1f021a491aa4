"""webhook_ingest.shared.db: what each of its modules holds.

- sessions      Postgres sessions that a silent server cannot hold
- queries       Named SQL blocks loaded from a package's `queries.sql`.
- values        Values as Postgres stores them and the JSON documents show them: jsonb, UTC instants, JSON.
- schema        The schema this release needs: every migration it ships (`shared/migrations/`) applied.
- group_commit  Many callers, one write per batch
- pooler        A pooler in transaction mode in front of Postgres is refused at start (docs/operations.md …
"""

from .group_commit import GroupCommit
from .pooler import TransactionPooler, refuse_transaction_pooling
from .queries import load_queries, parse_queries
from .schema import SchemaBehind
from .sessions import close_pool, closed_if_left_by, one_of, pooled, raise_if_cancelled, terminate
from .values import iso_utc, jsonb, to_json

__all__ = [
    "GroupCommit",
    "SchemaBehind",
    "TransactionPooler",
    "close_pool",
    "closed_if_left_by",
    "iso_utc",
    "jsonb",
    "load_queries",
    "one_of",
    "parse_queries",
    "pooled",
    "pooler",
    "raise_if_cancelled",
    "refuse_transaction_pooling",
    "schema",
    "terminate",
    "to_json",
]
