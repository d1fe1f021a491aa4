-- Named SQL blocks of the `shared` package (loaded by shared.queries.load_queries).

-- dead letters ---------------------------------------------------------------
-- The dead-letter store (shared.dead_letters): written by workers, read and
-- acted on by `webhook-ingest dlq …` and the admin HTTP API.

-- name: insert_dead_letter
-- One open dead letter per event: when the same key and payload already
-- has one (a worker died between recording it and acking the message, and
-- the redelivery failed again), that one's id, nothing inserted. A replayed
-- event that fails again gets a new row: its old one is no longer open.
WITH open AS (
    SELECT id FROM dead_letters
    WHERE key = $1::text AND payload_sha256 = $4::text AND status = 'dead'
    ORDER BY id LIMIT 1
), inserted AS (
    INSERT INTO dead_letters (key, source, event_id, payload_sha256, body, payload, headers,
                              received_at, attempts, errors)
    SELECT $1::text, $2::text, $3::text, $4::text, $5::bytea, $6::jsonb, $7::jsonb,
           $8::timestamptz, $9::integer, $10::jsonb
    WHERE NOT EXISTS (SELECT FROM open)
    RETURNING id
)
SELECT id FROM inserted UNION ALL SELECT id FROM open

-- name: list_dead_letters
-- Newest first; $1 source (NULL: every source), $2 status (NULL: every
-- status), $3 limit (NULL: no limit). The body and the error history stay
-- in the table: a listing needs only the last error.
SELECT id, key, source, event_id, status, attempts, created_at, updated_at,
       errors -> -1 AS last_error
FROM dead_letters
WHERE ($1::text IS NULL OR source = $1)
  AND ($2::text IS NULL OR status = $2)
ORDER BY id DESC
LIMIT $3

-- name: get_dead_letter
SELECT *, errors -> -1 AS last_error
FROM dead_letters
WHERE id = $1

-- name: dead_letters_to_replay
-- The rows a replay publishes: the given ids (whatever their status: an
-- explicit id is the operator's decision), or with $2 every open one,
-- optionally of one source ($3). Oldest first, the order they failed in.
SELECT id, key, source, event_id, payload_sha256, body, headers, received_at,
       errors -> -1 ->> 'type' AS last_error_type
FROM dead_letters
WHERE (id = ANY($1::bigint[]) OR ($2 AND status = 'dead' AND ($3::text IS NULL OR source = $3)))
ORDER BY id

-- name: set_dead_letter_status
UPDATE dead_letters SET status = $2, updated_at = now()
WHERE id = ANY($1::bigint[])
RETURNING id

-- name: completed_payload_sha256
-- The payload hash the key completed with, NULL while it has not.
SELECT payload_sha256 FROM processed_events WHERE key = $1

-- name: count_open_dead_letters
SELECT count(*) FROM dead_letters WHERE status = 'dead'

-- retention (webhook-ingest prune) --------------------------------------------
-- Each block deletes one batch; the caller loops, one short transaction per
-- batch, so pruning never holds locks on many rows at once.

-- name: retention_cutoff
SELECT now() - $1::interval

-- name: prune_completed_events
DELETE FROM processed_events
WHERE key IN (SELECT key FROM processed_events WHERE completed_at < $1 LIMIT $2)

-- name: prune_key_fences
DELETE FROM key_fences
WHERE key IN (SELECT key FROM key_fences WHERE updated_at < $1 LIMIT $2)
