"""webhook_ingest.shared.broker: what each of its modules holds.

- amqp              Connections to RabbitMQ, one node or a cluster.
- topology          Broker names and declarations (docs/reference.md §9), shared by ingress and workers.
- coalesced_writes  AMQP connections whose frames of one event-loop iteration leave in one send.
"""

from .topology import queue_depths

__all__ = ["amqp", "queue_depths", "topology"]
