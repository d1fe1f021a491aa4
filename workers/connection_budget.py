"""A worker's Postgres connections: one budget (WEBHOOK_INGEST_WORKER_CONNECTIONS),
split over its four pools (docs/design.md, "The claim path owns its resources").

The split keeps what the claim path cannot do without: two connections for
short statements (leases, completion checks, the completions of handlers
that never query: each shared by the runs that ask at once,
workers/claim/coalesced.py), one for lease renewals (a whole worker's in one
statement, workers/claim/renewals.py) and one for bookkeeping, which never takes
a claim connection. Handler transactions get the rest: they are what a
bigger budget buys. A run waiting for a transaction connection keeps its
lease and lock renewed meanwhile (workers/claim/lease.py), so a small pool adds
waiting, never a lost key.
"""

from typing import NamedTuple


class PoolSizes(NamedTuple):
    statements: int
    transactions: int
    renewals: int
    bookkeeping: int

    @property
    def total(self) -> int:
        return sum(self)


def split(budget: int, concurrency: int) -> PoolSizes:
    """At most `budget` connections (5 or more); no more transactions than messages in flight."""
    # one more of each at its own step, so a bigger budget never has fewer transactions;
    # at 28 (the sizes before the budget) it is 4, 2 and 2 again
    statements = 2 + (budget >= 12) + (budget >= 20)
    renewals = 1 + (budget >= 16)
    bookkeeping = 1 + (budget >= 24)
    transactions = min(concurrency, budget - statements - renewals - bookkeeping)
    return PoolSizes(statements, transactions, renewals, bookkeeping)
