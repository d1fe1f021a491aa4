-- The worker's edges (docs/design.md, "Exclusion").

-- The AMQP message id of the delivery whose run completed the key: a
-- redelivery (its worker died between the commit and the ack) recognises its
-- own completion and is counted as processed, not as a duplicate.
ALTER TABLE processed_events ADD COLUMN message_id text;

-- The key's lease: held from before the handler's transaction until its
-- completion commits (or it is released, or runs out), whether or not the
-- holder's session lives on (workers/claim/lease.py).
ALTER TABLE key_fences ADD COLUMN lease_until timestamptz;

-- A dead letter closed because its event completed after all (another copy's
-- retry chain): status `completed`, beside dead, replayed and discarded.
ALTER TABLE dead_letters DROP CONSTRAINT dead_letters_status_check;
ALTER TABLE dead_letters ADD CONSTRAINT dead_letters_status_check
    CHECK (status IN ('dead', 'replayed', 'discarded', 'completed'));

-- At most one open dead letter per event, enforced: a replay that has not
-- committed yet makes a new failure of its event wait for it (a later open
-- duplicate from before this index is closed as discarded, the first kept).
UPDATE dead_letters SET status = 'discarded', updated_at = now()
WHERE status = 'dead' AND id NOT IN (
    SELECT min(id) FROM dead_letters WHERE status = 'dead' GROUP BY key, payload_sha256);
CREATE UNIQUE INDEX dead_letters_one_open ON dead_letters (key, payload_sha256) WHERE status = 'dead';
