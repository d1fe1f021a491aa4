-- name: take_turn
-- The key's turn in Postgres: a transaction-scoped advisory lock, without
-- waiting. Every run takes it, Redis-locked or degraded, and keeps it until
-- its transaction ends (also when its session dies): the mutual exclusion
-- that holds whatever Redis forgets (docs/design.md, "Exclusion").
SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))

-- name: take_turns
-- take_turn for a batch of distinct keys; the keys whose turn we got.
SELECT key FROM unnest($1::text[]) AS batch(key)
WHERE pg_try_advisory_xact_lock(hashtextextended(key, 0))

-- name: acquire_fence
-- A new fencing token for the key (the sequence only grows), and whether
-- the key is already completed. Run in the turn's transaction, as its own
-- statement after take_turn: its snapshot is then taken after the previous
-- holder's commit, so it sees that completion.
WITH fence AS (
    INSERT INTO key_fences (key, token) VALUES ($1, nextval('fencing_tokens'))
    ON CONFLICT (key) DO UPDATE SET token = EXCLUDED.token, updated_at = now()
    RETURNING token
)
SELECT fence.token,
       (SELECT payload_sha256 FROM processed_events WHERE key = $1) AS completed_sha256
FROM fence

-- name: complete_event
-- The completion, in the handler's transaction: inserted only while our
-- fencing token is the key's current one and the key is not completed yet.
-- Defence in depth: under the turn no other token can be registered.
WITH fence AS (SELECT token FROM key_fences WHERE key = $1 FOR UPDATE)
INSERT INTO processed_events (key, source, event_id, payload_sha256, fencing_token, attempts, message_id)
SELECT $1, $2, $3, $4, $5, $6, $7 FROM fence WHERE fence.token = $5
ON CONFLICT (key) DO NOTHING
RETURNING key

-- name: completed_sha256
SELECT payload_sha256 FROM processed_events WHERE key = $1

-- name: record_conflict
INSERT INTO event_conflicts (key, source, event_id, completed_sha256, conflicting_sha256)
VALUES ($1, $2, $3, $4, $5)

-- name: insert_inbox
-- Idempotent on its own: a copy that arrives after `prune` forgot the key is
-- processed again (docs/design.md, "Retention"), and keeps the first row.
INSERT INTO inbox (key, source, event_id, payload, received_at)
VALUES ($1, $2, $3, $4::jsonb, $5)
ON CONFLICT (key) DO NOTHING

-- name: acquire_fences
-- acquire_fence for a batch of distinct keys whose turns we hold, in key
-- order (a fixed lock order).
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
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::bigint[], $6::int[], $7::text[])
        AS b(key, source, event_id, payload_sha256, fencing_token, attempts, message_id)
), fence AS (
    SELECT key, token FROM key_fences WHERE key = ANY($1::text[]) ORDER BY key FOR UPDATE
)
INSERT INTO processed_events (key, source, event_id, payload_sha256, fencing_token, attempts, message_id)
SELECT batch.* FROM batch JOIN fence ON fence.key = batch.key AND fence.token = batch.fencing_token
ON CONFLICT (key) DO NOTHING
RETURNING key

-- name: settled_before
-- A redelivered message (its worker died before the ack): did its own
-- earlier delivery complete the event ($3: its message id), or is the event
-- an open dead letter already? Either way it is settled; ack it.
SELECT coalesce((SELECT message_id FROM processed_events WHERE key = $1) = $3, false) AS completed,
       EXISTS (SELECT FROM dead_letters WHERE key = $1 AND payload_sha256 = $2 AND status = 'dead') AS dead
