"""The `webhook-ingest` command: the composition root that wires ingress,
workers and shared together (the only package that imports all three)."""
