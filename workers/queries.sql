-- name: acquire_fence
-- A new fencing token for the key (the sequence only grows), registered at
-- once (outside any transaction) so an older holder's completion is refused
-- from now on; also says whether the key is already completed.
WITH fence AS (
    INSERT INTO key_fences (key, token) VALUES ($1, nextval('fencing_tokens'))
    ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, updated_at = now()
    RETURNING token
)
SELECT fence.token,
       (SELECT payload_sha256 FROM processed_events WHERE key = $1) AS completed_sha256
FROM fence

-- name: lock_key_for_transaction
-- Degraded mode (no Redis): serialise workers on the key inside Postgres.
SELECT pg_advisory_xact_lock(hashtextextended($1, 0))

-- name: complete_event
-- The completion, in the handler's transaction: inserted only while our
-- fencing token is the key's current one and the key is not completed yet.
-- FOR UPDATE makes a concurrent takeover wait for us, or us see its token.
WITH fence AS (SELECT token FROM key_fences WHERE key = $1 FOR UPDATE)
INSERT INTO processed_events (key, source, event_id, payload_sha256, fencing_token, attempts)
SELECT $1, $2, $3, $4, $5, $6 FROM fence WHERE fence.token = $5
ON CONFLICT (key) DO NOTHING
RETURNING key

-- name: completed_sha256
SELECT payload_sha256 FROM processed_events WHERE key = $1

-- name: record_conflict
INSERT INTO event_conflicts (key, source, event_id, completed_sha256, conflicting_sha256)
VALUES ($1, $2, $3, $4, $5)

-- name: insert_inbox
INSERT INTO inbox (key, source, event_id, payload, received_at)
VALUES ($1, $2, $3, $4::jsonb, $5)

-- name: acquire_fences
-- acquire_fence for a batch of distinct keys, in key order (a fixed lock order).
WITH fence AS (
    INSERT INTO key_fences (key, token)
    SELECT key, nextval('fencing_tokens') FROM unnest($1::text[]) AS batch(key) ORDER BY key
    ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, updated_at = now()
    RETURNING key, token
)
SELECT fence.key, fence.token, processed_events.payload_sha256 AS completed_sha256
FROM fence LEFT JOIN processed_events USING (key)

-- name: complete_events
-- complete_event for a batch: rows whose token is still the key's current
-- one (fences locked in key order) and not completed yet; returns the keys
-- it inserted.
WITH batch AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::int[])
        AS b(key, source, event_id, payload_sha256, fencing_token, attempts)
), fence AS (
    SELECT key, token FROM key_fences WHERE key = ANY($1::text[]) ORDER BY key FOR UPDATE
)
INSERT INTO processed_events (key, source, event_id, payload_sha256, fencing_token, attempts)
SELECT batch.* FROM batch JOIN fence ON fence.key = batch.key AND fence.token = batch.fencing_token
ON CONFLICT (key) DO NOTHING
RETURNING key
