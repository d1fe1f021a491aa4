-- The worker's edges (docs/design.md, "Exclusion").

-- The AMQP message id of the delivery whose run completed the key: a
-- redelivery (its worker died between the commit and the ack) recognises its
-- own completion and is counted as processed, not as a duplicate.
ALTER TABLE processed_events ADD COLUMN message_id text;

-- The key's lease: held from before the handler's transaction until its
-- completion commits (or it is released, or runs out), whether or not the
-- holder's session lives on (workers/lease.py).
ALTER TABLE key_fences ADD COLUMN lease_until timestamptz;
