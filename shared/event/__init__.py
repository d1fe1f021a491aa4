"""webhook_ingest.shared.event: what each of its modules holds.

- ids         Event ids, content hashes and idempotency keys (docs/reference.md §5).
- types       An event's type, when its provider names one
- message     The event message on the broker: defined once, used by both sides.
- amqp_table  A message's AMQP properties encoded as pamqp encodes them, byte for byte, at a fraction of its …
- payloads    What a handler's `event.payload` is, in one place.
"""
