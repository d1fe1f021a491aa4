"""webhook_ingest.ingress.publishing: what each of its modules holds.

- publisher  The ingress's one connection to RabbitMQ.
- patience   How long the broker may be silent while a live request waits for its confirm, before the broker …
- outbox     The Postgres outbox: where the ingress keeps an event the broker did not confirm …
- relay      The outbox relay: one task per ingress process moves outbox rows to the events queue once the …
"""

from .outbox import OutboxUnavailable, outbox_key
from .publisher import GivenUp, Publisher, publisher_key
from .relay import relay_ctx

__all__ = ["GivenUp", "OutboxUnavailable", "Publisher", "outbox_key", "publisher_key", "relay_ctx"]
